package node_test

import (
	"context"
	"io"
	"net"
	"net/http"
	"strings"
	"testing"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/credentials/insecure"
	"google.golang.org/grpc/metadata"
	"google.golang.org/grpc/status"

	"github.com/regcluster/registry/internal/etcdtest"
	"github.com/regcluster/registry/internal/node"
	"github.com/regcluster/registry/internal/regnodetest"
	"github.com/regcluster/registry/internal/server"
	registryv1 "github.com/regcluster/registry/proto/registry/v1"
)

// hostIP is a non-loopback IPv4 address of this host, to call a regnode
// as a caller from elsewhere would be judged; the test is skipped on a
// host with none.
func hostIP(t *testing.T) string {
	t.Helper()
	addrs, err := net.InterfaceAddrs()
	if err != nil {
		t.Fatal(err)
	}
	for _, a := range addrs {
		if n, ok := a.(*net.IPNet); ok && n.IP.To4() != nil && !n.IP.IsLoopback() && !n.IP.IsLinkLocalUnicast() {
			return n.IP.String()
		}
	}
	t.Skip("this host has no non-loopback IPv4 address")
	return ""
}

// An operator's DELETE over HTTP (no secret) is judged, without auth, by
// the HTTP caller's own address, not by the HTTP API's loopback
// connection to the gRPC API: refused from another address, allowed from
// this host. A gRPC client that sends the forwarding metadata itself
// gains nothing. Registration over HTTP follows the gRPC API's rules on a
// non-loopback HTTP port too, while drain stays read-only there.
func TestHTTPOperatorDeleteJudgesTheHTTPCaller(t *testing.T) {
	ip := hostIP(t)
	m := etcdtest.Start(t, false)
	rn := regnodetest.StartWith(t, node.Config{EtcdEndpoints: []string{m.ClientURL}, Listen: "0.0.0.0:0",
		MetricsListen: "0.0.0.0:0", Insecure: true}, m.ClientURL)
	// Both ports on every address: the HTTP API calls the gRPC API on
	// loopback, which is what must not count for its callers.
	_, port, err := net.SplitHostPort(rn.Node.MetricsAddr())
	if err != nil {
		t.Fatal(err)
	}
	_, apiPort, err := net.SplitHostPort(rn.Node.Addr())
	if err != nil {
		t.Fatal(err)
	}
	remote, local := "http://"+net.JoinHostPort(ip, port), "http://"+net.JoinHostPort("127.0.0.1", port)
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	hc := &http.Client{Transport: &http.Transport{}}
	defer hc.CloseIdleConnections()
	do := func(method, url, body string) (int, string) {
		t.Helper()
		req, err := http.NewRequestWithContext(ctx, method, url, strings.NewReader(body))
		if err != nil {
			t.Fatal(err)
		}
		resp, err := hc.Do(req)
		if err != nil {
			t.Fatal(err)
		}
		defer resp.Body.Close()
		b, _ := io.ReadAll(resp.Body)
		return resp.StatusCode, string(b)
	}
	present := func(id string) bool {
		r, err := rn.Etcd.Get(ctx, rn.Prefix+"instances/web/"+id)
		if err != nil {
			t.Fatal(err)
		}
		return len(r.Kvs) == 1
	}

	// Registration over HTTP from elsewhere: the gRPC API's rules, which
	// let anyone register without auth.
	if code, body := do("POST", remote+"/api/v1/services/web/instances", `{"id":"w-1","address":"10.0.0.1:80","ttl":"1h"}`); code != 201 {
		t.Fatalf("register over HTTP from %s: %d %s", ip, code, body)
	}
	if code, body := do("POST", remote+"/api/v1/services/web/instances/w-1/drain", ""); code != 403 || !strings.Contains(body, "read-only") {
		t.Errorf("drain on a non-loopback HTTP port without auth: %d %s, want 403 read-only", code, body)
	}
	if code, body := do("DELETE", remote+"/api/v1/services/web/instances/w-1", ""); code != 403 || !strings.Contains(body, "secret is required") {
		t.Errorf("operator's DELETE from %s: %d %s, want 403 naming the secret", ip, code, body)
	}
	if !present("w-1") {
		t.Fatal("a refused DELETE deleted the record")
	}

	cc, err := grpc.NewClient(net.JoinHostPort(ip, apiPort), grpc.WithTransportCredentials(insecure.NewCredentials()))
	if err != nil {
		t.Fatal(err)
	}
	defer cc.Close()
	forged := metadata.AppendToOutgoingContext(ctx, server.ForwardedForMD, "127.0.0.1:1", server.ForwardKeyMD, "guessed-key")
	_, err = registryv1.NewRegistryClient(cc).Deregister(forged, &registryv1.DeregisterRequest{Service: "web", Id: "w-1"})
	if status.Code(err) != codes.PermissionDenied || !present("w-1") {
		t.Errorf("gRPC Deregister from %s with forged forwarding metadata: %v, want PermissionDenied and nothing deleted", ip, err)
	}

	if code, body := do("DELETE", local+"/api/v1/services/web/instances/w-1", ""); code != 200 || !strings.Contains(body, `"deleted":true`) {
		t.Errorf("operator's DELETE from this host: %d %s, want 200", code, body)
	}
	if present("w-1") {
		t.Error("the record is still there after the operator's DELETE from this host")
	}
}
