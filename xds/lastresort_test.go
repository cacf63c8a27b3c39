package xds_test

import (
	"context"
	"io"
	"net/http"
	"slices"
	"strconv"
	"strings"
	"testing"
	"time"

	corev3 "github.com/envoyproxy/go-control-plane/envoy/config/core/v3"
	endpointv3 "github.com/envoyproxy/go-control-plane/envoy/config/endpoint/v3"
	discoverygrpc "github.com/envoyproxy/go-control-plane/envoy/service/discovery/v3"
	resourcev3 "github.com/envoyproxy/go-control-plane/pkg/resource/v3"
	clientv3 "go.etcd.io/etcd/client/v3"
	"google.golang.org/protobuf/types/known/durationpb"

	"github.com/regcluster/registry/client"
	"github.com/regcluster/registry/internal/regnodetest"
	registryv1 "github.com/regcluster/registry/proto/registry/v1"
)

// edsWatch follows orders' assignment on a delta stream: each version's
// endpoint names (nil: the service is absent), ACKing each.
func edsWatch(t *testing.T, ctx context.Context, addr string) <-chan []string {
	t.Helper()
	ds, err := adsClient(t, addr).DeltaAggregatedResources(ctx)
	if err != nil {
		t.Fatal(err)
	}
	if err := ds.Send(&discoverygrpc.DeltaDiscoveryRequest{Node: &corev3.Node{Id: "envoy-lr", UserAgentName: "envoy"},
		TypeUrl: resourcev3.EndpointType, ResourceNamesSubscribe: []string{"orders"}}); err != nil {
		t.Fatal(err)
	}
	out := make(chan []string, 64)
	go func() {
		defer close(out)
		for {
			resp, err := ds.Recv()
			if err != nil {
				return
			}
			var names []string
			for _, r := range resp.Resources {
				cla := &endpointv3.ClusterLoadAssignment{}
				if r.Resource.UnmarshalTo(cla) != nil {
					continue
				}
				names = []string{}
				for _, l := range cla.Endpoints {
					for _, e := range l.LbEndpoints {
						names = append(names, e.GetEndpoint().GetHostname())
					}
				}
				slices.Sort(names)
			}
			out <- names
			if ds.Send(&discoverygrpc.DeltaDiscoveryRequest{TypeUrl: resourcev3.EndpointType, ResponseNonce: resp.Nonce}) != nil {
				return
			}
		}
	}()
	return out
}

// awaitEDS waits for a version whose endpoints are want (nil: absent or
// empty) and fails on any other version before it that is not one of
// allowed.
func awaitEDS(t *testing.T, ch <-chan []string, want []string, allowed ...[]string) {
	t.Helper()
	timeout := time.After(time.Minute)
	for {
		select {
		case got, ok := <-ch:
			if !ok {
				t.Fatal("the xDS stream ended")
			}
			if slices.Equal(got, want) || (len(want) == 0 && len(got) == 0) {
				return
			}
			if !slices.ContainsFunc(allowed, func(a []string) bool { return slices.Equal(a, got) }) {
				t.Fatalf("xDS offered %v while %v was awaited (allowed before it: %v)", got, want, allowed)
			}
		case <-timeout:
			t.Fatalf("xDS never offered %v", want)
		}
	}
}

// Most of a service vanishing by lease expiry (three leases revoked at
// once, standing for an etcd stall) leaves its instances offered to xDS
// clients as a last resort; one registering again ends it at once. A
// deregistration empties the list at once, as it always did.
func TestXDSLastResort(t *testing.T) {
	rn := regnodetest.Start(t)
	c, err := client.New(client.Config{Endpoints: []string{rn.Addr}})
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	leases := map[string]int64{}
	reg := func(id, addr string) {
		t.Helper()
		resp, err := c.API().Register(ctx, &registryv1.RegisterRequest{Ttl: durationpb.New(time.Hour),
			Instance: &registryv1.Instance{Service: "orders", Id: id, Address: addr}})
		if err != nil {
			t.Fatal(err)
		}
		leases[id] = resp.LeaseId
	}
	reg("a", "10.0.0.1:80")
	reg("b", "10.0.0.2:80")
	reg("c", "10.0.0.3:80")
	eds := edsWatch(t, ctx, rn.Addr)
	awaitEDS(t, eds, []string{"a", "b", "c"}, []string{"a"}, []string{"a", "b"})

	for _, id := range []string{"a", "b", "c"} {
		if _, err := rn.Etcd.Revoke(ctx, clientv3.LeaseID(leases[id])); err != nil {
			t.Fatal(err)
		}
	}
	resp, err := rn.Etcd.Get(ctx, rn.Prefix+"instances/orders/", clientv3.WithPrefix(), clientv3.WithCountOnly())
	if err != nil || resp.Count != 0 {
		t.Fatalf("instances left in etcd: %v, %v", resp, err)
	}
	rn.WaitRevision(t, resp.Header.Revision)
	// Built: the xDS server saw the service vanish.
	waitFor(t, time.Minute, "the xDS server's last resort", func() bool {
		return metricValue(t, rn, "registry_xds_last_resort_started_total") == 1
	})
	// Gone from etcd, still offered: to a client that comes now too.
	awaitEDS(t, edsWatch(t, ctx, rn.Addr), []string{"a", "b", "c"})
	// b registers again: the last resort ends at once; never an empty
	// list before.
	reg("b", "10.0.0.2:80")
	awaitEDS(t, eds, []string{"b"}, []string{"a", "b", "c"})
	// A deregistration empties the list at once: a and c are not offered
	// again.
	if _, err := c.API().Deregister(ctx, &registryv1.DeregisterRequest{Service: "orders", Id: "b", LeaseId: leases["b"]}); err != nil {
		t.Fatal(err)
	}
	awaitEDS(t, eds, nil)
}

// metricValue reads one sample of rn's /metrics (-1 if absent).
func metricValue(t *testing.T, rn *regnodetest.Regnode, name string) float64 {
	t.Helper()
	resp, err := http.Get("http://" + rn.Node.MetricsAddr() + "/metrics")
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	body, err := io.ReadAll(resp.Body)
	if err != nil {
		t.Fatal(err)
	}
	for _, line := range strings.Split(string(body), "\n") {
		if v, ok := strings.CutPrefix(line, name+" "); ok {
			f, err := strconv.ParseFloat(v, 64)
			if err == nil {
				return f
			}
		}
	}
	return -1
}
