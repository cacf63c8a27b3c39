package xds_test

import (
	"context"
	"fmt"
	"testing"
	"time"

	corev3 "github.com/envoyproxy/go-control-plane/envoy/config/core/v3"
	discoverygrpc "github.com/envoyproxy/go-control-plane/envoy/service/discovery/v3"
	resourcev3 "github.com/envoyproxy/go-control-plane/pkg/resource/v3"
	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/testutil"
	statuspb "google.golang.org/genproto/googleapis/rpc/status"
	"google.golang.org/protobuf/types/known/durationpb"

	"github.com/regcluster/registry/client"
	"github.com/regcluster/registry/internal/regnodetest"
	registryv1 "github.com/regcluster/registry/proto/registry/v1"
	"github.com/regcluster/registry/xds"
)

// waitUntil polls cond until it holds, failing t after 30 s with what
// cond last said.
func waitUntil(t *testing.T, what string, cond func() (bool, string)) {
	t.Helper()
	deadline := time.Now().Add(30 * time.Second)
	for {
		ok, last := cond()
		if ok {
			return
		}
		if time.Now().After(deadline) {
			t.Fatalf("%s: never; last %s", what, last)
		}
		time.Sleep(10 * time.Millisecond)
	}
}

// counter is the counter name's value on reg.
func counter(t *testing.T, reg *prometheus.Registry, name string) float64 {
	t.Helper()
	mfs, err := reg.Gather()
	if err != nil {
		t.Fatal(err)
	}
	for _, mf := range mfs {
		if mf.GetName() == name {
			return mf.GetMetric()[0].GetCounter().GetValue()
		}
	}
	t.Fatalf("%s not registered", name)
	return 0
}

// pushCount is registry_xds_push_seconds' count on reg.
func pushCount(t *testing.T, reg *prometheus.Registry) uint64 {
	t.Helper()
	mfs, err := reg.Gather()
	if err != nil {
		t.Fatal(err)
	}
	for _, mf := range mfs {
		if mf.GetName() == "registry_xds_push_seconds" {
			return mf.GetMetric()[0].GetHistogram().GetSampleCount()
		}
	}
	t.Fatal("registry_xds_push_seconds not registered")
	return 0
}

// Server.Clients follows each ADS stream: node id, kind and protocol, what
// it follows, the revision it acknowledged against the one served (behind
// until it ACKs), its NACKs; registry_xds_clients counts the streams by
// kind and registry_xds_push_seconds times each push of a change, not the
// answer to a new subscription.
func TestClientsAndPushMetric(t *testing.T) {
	rn := regnodetest.Start(t)
	c, err := client.New(client.Config{Endpoints: []string{rn.Addr}})
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	reg := func(id string) int64 {
		t.Helper()
		svc := "orders"
		if id == "p" {
			svc = "pay"
		}
		r, err := c.API().Register(ctx, &registryv1.RegisterRequest{Ttl: durationpb.New(time.Minute), Instance: &registryv1.Instance{
			Service: svc, Id: id, Address: "10.0.0.1:80"}})
		if err != nil {
			t.Fatal(err)
		}
		return r.Revision
	}
	xs, mreg := rn.Node.XDS(), rn.Node.Metrics().Registry
	// regBuilt registers id and waits for the xDS server to build it.
	regBuilt := func(id string) {
		t.Helper()
		builds := counter(t, mreg, "registry_xds_builds_total")
		reg(id)
		waitUntil(t, id+" built", func() (bool, string) {
			n := counter(t, mreg, "registry_xds_builds_total")
			return n > builds, fmt.Sprintf("%v builds", n)
		})
	}
	regBuilt("a") // before the stream: its first answer is of a build
	client1 := func() (xds.ClientInfo, string) {
		cs := xs.Clients()
		if len(cs) != 1 {
			return xds.ClientInfo{}, fmt.Sprintf("%d clients: %+v", len(cs), cs)
		}
		return cs[0], fmt.Sprintf("%+v", cs[0])
	}

	ss, err := adsClient(t, rn.Addr).StreamAggregatedResources(ctx)
	if err != nil {
		t.Fatal(err)
	}
	// req asks for orders; with a response, ACKs it (or NACKs it with a
	// message), keeping the version it had before as gRPC does.
	acked, names := "", []string{"orders"}
	req := func(resp *discoverygrpc.DiscoveryResponse, nack string) {
		t.Helper()
		r := &discoverygrpc.DiscoveryRequest{Node: &corev3.Node{Id: "grpc-1", UserAgentName: "gRPC Go"},
			TypeUrl: resourcev3.EndpointType, ResourceNames: names}
		if resp != nil {
			r.ResponseNonce = resp.Nonce
			if nack == "" {
				acked = resp.VersionInfo
			}
		}
		r.VersionInfo = acked
		if nack != "" {
			r.ErrorDetail = &statuspb.Status{Code: 3, Message: nack}
		}
		if err := ss.Send(r); err != nil {
			t.Fatal(err)
		}
	}
	req(nil, "")
	resp, err := ss.Recv()
	if err != nil {
		t.Fatal(err)
	}
	req(resp, "")
	waitUntil(t, "the stream listed as acknowledging orders", func() (bool, string) {
		cl, s := client1()
		ok := cl.NodeID == "grpc-1" && cl.Kind == "grpc" && cl.UserAgent == "gRPC Go" && cl.Protocol == "sotw" &&
			len(cl.Services) == 1 && cl.Services[0].Service == "orders" && cl.Services[0].Acked > 0 &&
			cl.Services[0].Acked == cl.Services[0].Revision && !cl.Connected.IsZero() && cl.Peer != ""
		return ok, s
	})
	if n := testutil.ToFloat64(gaugeOf(t, mreg, "registry_xds_clients", "grpc")); n != 1 {
		t.Errorf(`registry_xds_clients{kind="grpc"} = %v, want 1`, n)
	}
	if n := pushCount(t, mreg); n != 0 {
		t.Errorf("registry_xds_push_seconds counted %d responses to a new subscription, want 0", n)
	}

	// A change: pushed (timed), behind until acknowledged.
	rev := reg("b")
	if resp, err = ss.Recv(); err != nil {
		t.Fatal(err)
	}
	waitUntil(t, "the push timed", func() (bool, string) {
		n := pushCount(t, mreg)
		return n == 1, fmt.Sprintf("count %d", n)
	})
	waitUntil(t, "the stream behind", func() (bool, string) {
		cl, s := client1()
		return len(cl.Services) == 1 && cl.Services[0].Revision >= rev && cl.Services[0].Acked < cl.Services[0].Revision, s
	})
	req(resp, "")
	waitUntil(t, "the stream caught up", func() (bool, string) {
		cl, s := client1()
		return len(cl.Services) == 1 && cl.Services[0].Acked >= rev && cl.Services[0].Acked == cl.Services[0].Revision, s
	})

	// A new subscription's answer is no push, though built after the
	// stream opened.
	regBuilt("p")
	names = []string{"orders", "pay"}
	req(nil, "")
	if resp, err = ss.Recv(); err != nil {
		t.Fatal(err)
	}
	if n := pushCount(t, mreg); n != 1 {
		t.Errorf("registry_xds_push_seconds counted %d responses, want 1: the answer to a new subscription was timed", n)
	}
	req(resp, "")

	// A NACK is counted with its message.
	reg("c")
	if resp, err = ss.Recv(); err != nil {
		t.Fatal(err)
	}
	req(resp, "no thanks")
	waitUntil(t, "the NACK listed", func() (bool, string) {
		cl, s := client1()
		return cl.NACKs == 1 && cl.LastNACK == "no thanks" && len(cl.Services) == 2 && cl.Services[0].Acked < cl.Services[0].Revision, s
	})

	// An Envoy over delta.
	ds, err := adsClient(t, rn.Addr).DeltaAggregatedResources(ctx)
	if err != nil {
		t.Fatal(err)
	}
	if err := ds.Send(&discoverygrpc.DeltaDiscoveryRequest{Node: &corev3.Node{Id: "envoy-1", UserAgentName: "envoy"},
		TypeUrl: resourcev3.EndpointType, ResourceNamesSubscribe: []string{"orders"}}); err != nil {
		t.Fatal(err)
	}
	waitUntil(t, "the Envoy listed", func() (bool, string) {
		cs := xs.Clients()
		return len(cs) == 2 && cs[0].Kind == "envoy" && cs[0].Protocol == "delta" && cs[0].NodeID == "envoy-1" &&
				cs[0].StreamID == 1 && cs[1].StreamID == 1 && cs[1].NodeID == "grpc-1",
			fmt.Sprintf("%+v", cs)
	})
	if n := testutil.ToFloat64(gaugeOf(t, mreg, "registry_xds_clients", "envoy")); n != 1 {
		t.Errorf(`registry_xds_clients{kind="envoy"} = %v, want 1`, n)
	}
}

// gaugeOf is the series of name with label kind=kind gathered off reg, as
// a Collector testutil.ToFloat64 reads.
func gaugeOf(t *testing.T, reg *prometheus.Registry, name, kind string) prometheus.Collector {
	t.Helper()
	mfs, err := reg.Gather()
	if err != nil {
		t.Fatal(err)
	}
	for _, mf := range mfs {
		if mf.GetName() != name {
			continue
		}
		for _, m := range mf.GetMetric() {
			for _, l := range m.GetLabel() {
				if l.GetName() == "kind" && l.GetValue() == kind {
					g := prometheus.NewGauge(prometheus.GaugeOpts{Name: name})
					g.Set(m.GetGauge().GetValue())
					return g
				}
			}
		}
	}
	t.Fatalf("%s{kind=%q} not gathered", name, kind)
	return nil
}
