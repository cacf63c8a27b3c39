package main

import (
	"context"
	"net"
	"strings"
	"testing"
	"time"

	corev3 "github.com/envoyproxy/go-control-plane/envoy/config/core/v3"
	discoverygrpc "github.com/envoyproxy/go-control-plane/envoy/service/discovery/v3"
	resourcev3 "github.com/envoyproxy/go-control-plane/pkg/resource/v3"
	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials/insecure"

	"github.com/regcluster/registry/internal/regnodetest"
	registryv1 "github.com/regcluster/registry/proto/registry/v1"
)

// regctl xds clients: a table row per xDS stream (regnode, node id, kind,
// services, acked, behind, NACKs), -o wide with the protocol and peer,
// -o json in snake_case; a regnode announced but unreachable is named on
// stderr while the command succeeds.
func TestXDSClients(t *testing.T) {
	rn := regnodetest.Start(t)
	ctl := ctlOf(t, rn.Addr)
	api := apiClient(t, rn.Addr)
	seed(t, api, &registryv1.Instance{Service: "orders", Id: "o-1", Address: "10.0.0.1:80"})
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()

	cc, err := grpc.NewClient(rn.Addr, grpc.WithTransportCredentials(insecure.NewCredentials()))
	if err != nil {
		t.Fatal(err)
	}
	defer cc.Close()
	ss, err := discoverygrpc.NewAggregatedDiscoveryServiceClient(cc).StreamAggregatedResources(ctx)
	if err != nil {
		t.Fatal(err)
	}
	n := &corev3.Node{Id: "checkout-7", UserAgentName: "gRPC Go"}
	req := &discoverygrpc.DiscoveryRequest{Node: n, TypeUrl: resourcev3.EndpointType, ResourceNames: []string{"orders"}}
	if err := ss.Send(req); err != nil {
		t.Fatal(err)
	}
	go func() { // ACKs every response, as a client does, until the stream ends
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

	// The ACK is taken a moment after it is sent, and the xDS view follows
	// the registry a moment behind: wait for "no" behind at a revision.
	var row []string
	deadline := time.Now().Add(30 * time.Second)
	for {
		r := mustOK(t, ctl("xds", "clients"))
		rs := rows(r.stdout)
		if want := []string{"REGNODE", "NODE-ID", "KIND", "SERVICES", "ACKED", "BEHIND", "NACKS", "LAST-NACK"}; strings.Join(rs[0], " ") != strings.Join(want, " ") {
			t.Fatalf("header %v, want %v", rs[0], want)
		}
		// Caught up at a real revision: a stream that came before the
		// regnode's xDS view had the service reads 0 acked, 0 served.
		if len(rs) == 2 && len(rs[1]) == 8 && rs[1][5] == "no" && rs[1][4] != "0" {
			row = rs[1]
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("the client never listed as caught up: %v", r)
		}
		time.Sleep(20 * time.Millisecond)
	}
	if row[0] != rn.Node.Name() || row[1] != "checkout-7" || row[2] != "grpc" || row[3] != "orders" || row[4] == "0" || row[6] != "0" || row[7] != "-" {
		t.Errorf("row %v: want %s checkout-7 grpc orders <rev> no 0 -", row, rn.Node.Name())
	}
	wide := rows(mustOK(t, ctl("xds", "clients", "-o", "wide", "--local")).stdout)
	if len(wide) != 2 || len(wide[1]) != 14 || wide[1][9] != "sotw" || !strings.HasPrefix(wide[1][10], "127.0.0.1:") || wide[1][11]+" "+wide[1][12] != "gRPC Go" {
		t.Errorf("-o wide: %v", wide)
	}

	// A regnode announced where nothing answers: named on stderr, exit 0.
	lis, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	ghost := lis.Addr().String()
	lis.Close()
	if _, err := rn.Etcd.Put(ctx, rn.Prefix+"nodes/"+ghost, "ghost"); err != nil {
		t.Fatal(err)
	}
	r := ctl("xds", "clients", "-o", "json")
	if r.code != 0 || !strings.HasPrefix(r.stderr, "regctl: regnode ghost ("+ghost+"): ") || strings.Count(r.stderr, "\n") != 1 {
		t.Fatalf("a regnode unreachable: want exit 0 and it named on stderr; %v", r)
	}
	var v struct {
		Nodes []struct {
			Node    string `json:"node"`
			Error   string `json:"error"`
			Clients []struct {
				Node     string `json:"node"`
				StreamID int64  `json:"stream_id"`
				NodeID   string `json:"node_id"`
				Kind     string `json:"kind"`
				Protocol string `json:"protocol"`
				Services []struct {
					Service       string `json:"service"`
					AckedRevision int64  `json:"acked_revision"`
					Revision      int64  `json:"revision"`
					Behind        bool   `json:"behind"`
				} `json:"services"`
				Behind    bool   `json:"behind"`
				NACKs     *int64 `json:"nacks"`
				Connected string `json:"connected"`
			} `json:"clients"`
		} `json:"nodes"`
	}
	decodeJSON(t, r, &v)
	if len(v.Nodes) != 2 || v.Nodes[0].Node != rn.Node.Name() || v.Nodes[1].Error == "" || len(v.Nodes[0].Clients) != 1 {
		t.Fatalf("-o json: %s", r.stdout)
	}
	c := v.Nodes[0].Clients[0]
	if c.Node != rn.Node.Name() || c.StreamID == 0 || c.NodeID != "checkout-7" || c.Kind != "grpc" || c.Protocol != "sotw" ||
		len(c.Services) != 1 || c.Services[0].Service != "orders" || c.Services[0].AckedRevision == 0 ||
		c.Services[0].AckedRevision != c.Services[0].Revision || c.Services[0].Behind || c.Behind || c.NACKs == nil || c.Connected == "" {
		t.Errorf("-o json client: %s", r.stdout)
	}
}
