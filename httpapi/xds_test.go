package httpapi_test

import (
	"context"
	"encoding/json"
	"net/http"
	"testing"
	"time"

	corev3 "github.com/envoyproxy/go-control-plane/envoy/config/core/v3"
	discoverygrpc "github.com/envoyproxy/go-control-plane/envoy/service/discovery/v3"
	resourcev3 "github.com/envoyproxy/go-control-plane/pkg/resource/v3"
	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials/insecure"

	"github.com/regcluster/registry/internal/render"
	registryv1 "github.com/regcluster/registry/proto/registry/v1"
)

// GET /api/v1/xds/clients is regctl xds clients -o json: the regnode's
// xDS streams; ?local takes a boolean, and nothing else is taken.
func TestXdsClientsRoute(t *testing.T) {
	f := start(t)
	f.register(t, "orders", "o-1", "127.0.0.1:9001")
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	cc, err := grpc.NewClient(f.rn.Addr, grpc.WithTransportCredentials(insecure.NewCredentials()))
	if err != nil {
		t.Fatal(err)
	}
	defer cc.Close()
	ss, err := discoverygrpc.NewAggregatedDiscoveryServiceClient(cc).StreamAggregatedResources(ctx)
	if err != nil {
		t.Fatal(err)
	}
	req := &discoverygrpc.DiscoveryRequest{Node: &corev3.Node{Id: "web-1", UserAgentName: "gRPC Go"},
		TypeUrl: resourcev3.EndpointType, ResourceNames: []string{"orders"}}
	if err := ss.Send(req); err != nil {
		t.Fatal(err)
	}
	go func() { // ACKs every response until the stream ends
		for {
			resp, err := ss.Recv()
			if err != nil {
				return
			}
			req.VersionInfo, req.ResponseNonce = resp.VersionInfo, resp.Nonce
			if ss.Send(req) != nil {
				return
			}
		}
	}()

	var body []byte
	deadline := time.Now().Add(30 * time.Second)
	for {
		var code int
		code, body, _ = f.do(t, "GET", "/api/v1/xds/clients?local=true", "")
		var v render.XdsClients
		if err := json.Unmarshal(body, &v); code != http.StatusOK || err != nil {
			t.Fatalf("GET /api/v1/xds/clients = %d %s (%v)", code, body, err)
		}
		if len(v.Nodes) == 1 && len(v.Nodes[0].Clients) == 1 && v.Nodes[0].Clients[0].NodeID == "web-1" &&
			len(v.Nodes[0].Clients[0].Services) == 1 && v.Nodes[0].Clients[0].Services[0].AckedRevision > 0 && !v.Nodes[0].Clients[0].Behind {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("the xDS client never listed as caught up: %s", body)
		}
		time.Sleep(20 * time.Millisecond)
	}
	resp, err := f.rpc.XdsClients(ctx, &registryv1.XdsClientsRequest{})
	if err != nil {
		t.Fatal(err)
	}
	if got, want := string(body), jsonOf(t, render.NewXdsClients(resp)); got != want {
		t.Errorf("GET /api/v1/xds/clients =\n%s\nwant (regctl xds clients -o json)\n%s", got, want)
	}
	if code, body, _ := f.do(t, "GET", "/api/v1/xds/clients", ""); code != http.StatusOK {
		t.Errorf("every regnode's: %d %s", code, body)
	}
	for _, q := range []string{"?local=maybe", "?all=1"} {
		code, body, _ := f.do(t, "GET", "/api/v1/xds/clients"+q, "")
		var e apiErr
		if err := json.Unmarshal(body, &e); code != http.StatusBadRequest || err != nil || e.Field == "" {
			t.Errorf("GET /api/v1/xds/clients%s = %d %s, want 400 naming the field", q, code, body)
		}
	}
}
