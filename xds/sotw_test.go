package xds_test

import (
	"context"
	"testing"
	"time"

	corev3 "github.com/envoyproxy/go-control-plane/envoy/config/core/v3"
	endpointv3 "github.com/envoyproxy/go-control-plane/envoy/config/endpoint/v3"
	discoverygrpc "github.com/envoyproxy/go-control-plane/envoy/service/discovery/v3"
	resourcev3 "github.com/envoyproxy/go-control-plane/pkg/resource/v3"
	statuspb "google.golang.org/genproto/googleapis/rpc/status"
	"google.golang.org/protobuf/types/known/durationpb"

	"github.com/regcluster/registry/client"
	"github.com/regcluster/registry/internal/regnodetest"
	registryv1 "github.com/regcluster/registry/proto/registry/v1"
)

// The state-of-the-world protocol as a gRPC client sees it: one response
// at a time per type; a request naming an older nonce while a response
// is unanswered is ignored; a NACK is answered with nothing (the client
// keeps its version) until something it follows changes; a change of a
// service it does not follow sends it nothing; each response carries only
// the assignments that changed.
func TestSotwProtocol(t *testing.T) {
	rn := regnodetest.Start(t)
	c, err := client.New(client.Config{Endpoints: []string{rn.Addr}})
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	reg := func(svc, id string) {
		t.Helper()
		if _, err := c.API().Register(ctx, &registryv1.RegisterRequest{Ttl: durationpb.New(time.Minute), Instance: &registryv1.Instance{
			Service: svc, Id: id, Address: "10.0.0.1:" + map[string]string{"a": "81", "b": "82", "c": "83", "x": "84"}[id]}}); err != nil {
			t.Fatal(err)
		}
	}
	ss, err := adsClient(t, rn.Addr).StreamAggregatedResources(ctx)
	if err != nil {
		t.Fatal(err)
	}
	node := &corev3.Node{Id: "grpc-p", UserAgentName: "gRPC Go"}
	send := func(version, nonce string, names []string, nack string) {
		t.Helper()
		r := &discoverygrpc.DiscoveryRequest{Node: node, TypeUrl: resourcev3.EndpointType, ResourceNames: names,
			VersionInfo: version, ResponseNonce: nonce}
		if nack != "" {
			r.ErrorDetail = &statuspb.Status{Code: 3, Message: nack}
		}
		if err := ss.Send(r); err != nil {
			t.Fatal(err)
		}
	}
	// recv is the next response, as the services it carries and how many
	// endpoints each has.
	recv := func() (*discoverygrpc.DiscoveryResponse, map[string]int) {
		t.Helper()
		resp, err := ss.Recv()
		if err != nil {
			t.Fatal(err)
		}
		got := map[string]int{}
		for _, a := range resp.Resources {
			var cla endpointv3.ClusterLoadAssignment
			if err := a.UnmarshalTo(&cla); err != nil {
				t.Fatal(err)
			}
			got[cla.ClusterName] = len(cla.Endpoints)
		}
		return resp, got
	}

	reg("orders", "a")
	reg("pay", "x")
	// The view may not hold both yet: read until it does, ACKing.
	send("", "", []string{"orders", "pay"}, "")
	seen := map[string]int{}
	var resp *discoverygrpc.DiscoveryResponse
	for seen["orders"] != 1 || seen["pay"] != 1 {
		var got map[string]int
		resp, got = recv()
		for k, v := range got {
			seen[k] = v
		}
		send(resp.VersionInfo, resp.Nonce, []string{"orders", "pay"}, "")
	}
	good := resp.VersionInfo

	// A change of orders: the response carries orders alone.
	reg("orders", "b")
	resp, got := recv()
	if len(got) != 1 || got["orders"] != 2 {
		t.Fatalf("after orders' change: %v, want orders with 2 endpoints alone", got)
	}
	// Unanswered: a request with an older nonce (dropping pay) is ignored,
	// so pay's next change still reaches the client.
	send(good, "stale", []string{"orders"}, "")
	// NACKed: nothing is sent again until a change.
	send(good, resp.Nonce, []string{"orders", "pay"}, "no thanks")
	reg("other", "c") // followed by no one: nothing
	reg("pay", "c")
	resp, got = recv()
	if len(got) != 1 || got["pay"] != 2 {
		t.Fatalf("after the NACK and pay's change: %v, want pay with 2 endpoints alone (nothing resent, the stale request ignored)", got)
	}
	if resp.VersionInfo == good {
		t.Fatalf("version %s again after a change", resp.VersionInfo)
	}
}
