package server_test

import (
	"context"
	"fmt"
	"net"
	"testing"
	"time"

	corev3 "github.com/envoyproxy/go-control-plane/envoy/config/core/v3"
	discoverygrpc "github.com/envoyproxy/go-control-plane/envoy/service/discovery/v3"
	resourcev3 "github.com/envoyproxy/go-control-plane/pkg/resource/v3"
	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials/insecure"
	"google.golang.org/protobuf/encoding/protojson"

	"github.com/regcluster/registry/internal/etcdtest"
	"github.com/regcluster/registry/internal/regnodetest"
	registryv1 "github.com/regcluster/registry/proto/registry/v1"
)

// openADS opens a state-of-the-world ADS stream to addr as node id,
// asking for service's endpoints, and ACKs every answer.
func openADS(t *testing.T, ctx context.Context, addr, id, service string) {
	t.Helper()
	cc, err := grpc.NewClient(addr, grpc.WithTransportCredentials(insecure.NewCredentials()))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { cc.Close() })
	ss, err := discoverygrpc.NewAggregatedDiscoveryServiceClient(cc).StreamAggregatedResources(ctx)
	if err != nil {
		t.Fatal(err)
	}
	n := &corev3.Node{Id: id, UserAgentName: "gRPC Go"}
	if err := ss.Send(&discoverygrpc.DiscoveryRequest{Node: n, TypeUrl: resourcev3.EndpointType, ResourceNames: []string{service}}); err != nil {
		t.Fatal(err)
	}
	go func() { // ACKs every response, as a client does, until the stream ends
		for {
			resp, err := ss.Recv()
			if err != nil {
				return
			}
			if ss.Send(&discoverygrpc.DiscoveryRequest{Node: n, TypeUrl: resourcev3.EndpointType, ResourceNames: []string{service},
				VersionInfo: resp.VersionInfo, ResponseNonce: resp.Nonce}) != nil {
				return
			}
		}
	}()
}

// XdsClients answers a regnode's own xDS streams, and with all every
// regnode's, each named with the regnode serving it; a regnode announced
// but unreachable is listed with its error while the others answer.
func TestXdsClientsAsksEveryRegnode(t *testing.T) {
	m := etcdtest.Start(t, false)
	rns := []*regnodetest.Regnode{regnodetest.StartExternal(t, m.ClientURL), regnodetest.StartExternal(t, m.ClientURL)}
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	api := newClient(t, rns[0].Addr).API()
	r, err := api.Register(ctx, &registryv1.RegisterRequest{Instance: inst("alpha", "a-1")})
	if err != nil {
		t.Fatal(err)
	}
	for i, rn := range rns {
		rn.WaitRevision(t, r.Revision)
		openADS(t, ctx, rn.Addr, fmt.Sprintf("client-%d", i), "alpha")
	}
	ask := func(all bool) *registryv1.XdsClientsResponse {
		t.Helper()
		resp, err := api.XdsClients(ctx, &registryv1.XdsClientsRequest{All: all})
		if err != nil {
			t.Fatal(err)
		}
		return resp
	}
	// acked is each client listed, by node id, as "regnode acked/revision".
	acked := func(resp *registryv1.XdsClientsResponse) map[string]string {
		got := map[string]string{}
		for _, n := range resp.Nodes {
			for _, c := range n.Clients {
				for _, f := range c.Services {
					got[c.NodeId] = fmt.Sprintf("%s %s %v", c.Node, c.Kind, f.AckedRevision >= r.Revision && !f.Behind)
				}
			}
		}
		return got
	}
	want := map[string]string{"client-0": rns[0].Node.Name() + " grpc true", "client-1": rns[1].Node.Name() + " grpc true"}
	waitFor(t, 30*time.Second, "both clients listed, acknowledged", func() bool {
		got := acked(ask(true))
		return len(got) == 2 && got["client-0"] == want["client-0"] && got["client-1"] == want["client-1"]
	})
	if resp := ask(false); len(resp.Nodes) != 1 || resp.Nodes[0].Node != rns[0].Node.Name() || len(resp.Nodes[0].Clients) != 1 ||
		resp.Nodes[0].Clients[0].NodeId != "client-0" {
		t.Fatalf("this regnode's own: %s", protojson.Format(resp))
	}

	// A regnode announced where nothing answers.
	lis, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	ghost := lis.Addr().String()
	lis.Close()
	if _, err := rns[0].Etcd.Put(ctx, rns[0].Prefix+"nodes/"+ghost, "ghost"); err != nil {
		t.Fatal(err)
	}
	resp := ask(true)
	if len(resp.Nodes) != 3 {
		t.Fatalf("three regnodes announced: %s", protojson.Format(resp))
	}
	for _, n := range resp.Nodes {
		if (n.Node == "ghost") != (n.Error != "") || (n.Node == "ghost") != (n.Address == ghost) {
			t.Errorf("regnode %s at %s: error %q", n.Node, n.Address, n.Error)
		}
	}
	if got := acked(resp); len(got) != 2 {
		t.Errorf("with a regnode unreachable, the others' clients: %v", got)
	}
}
