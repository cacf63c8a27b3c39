package node_test

import (
	"context"
	"net/http"
	"net/http/httptest"
	"sync/atomic"
	"testing"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials/insecure"
	"google.golang.org/protobuf/types/known/durationpb"

	"github.com/regcluster/registry/internal/node"
	"github.com/regcluster/registry/internal/regnodetest"
	registryv1 "github.com/regcluster/registry/proto/registry/v1"
)

// A regnode's probes say who sends them: an HTTP-checked instance sees
// User-Agent "regnode/<node.Version> (<its --name>)".
func TestProbesSayWhoSendsThem(t *testing.T) {
	var ua atomic.Value
	ua.Store("")
	backend := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		ua.Store(r.UserAgent())
	}))
	t.Cleanup(backend.Close)

	rn := regnodetest.Start(t) // its embedded member, and so the regnode, is named "rn"
	cc, err := grpc.NewClient(rn.Addr, grpc.WithTransportCredentials(insecure.NewCredentials()))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { cc.Close() })
	if _, err := registryv1.NewRegistryClient(cc).Register(context.Background(), &registryv1.RegisterRequest{
		Instance: &registryv1.Instance{Service: "web", Id: "w-1", Address: backend.Listener.Addr().String(),
			Check: &registryv1.HealthCheck{Kind: registryv1.CheckKind_CHECK_KIND_HTTP, Target: "/healthz"}},
		Ttl: durationpb.New(time.Hour)}); err != nil {
		t.Fatal(err)
	}
	want := "regnode/" + node.Version + " (rn)"
	for deadline := time.Now().Add(30 * time.Second); ua.Load().(string) != want; {
		if time.Now().After(deadline) {
			t.Fatalf("the backend's last User-Agent is %q after 30s, want %q", ua.Load(), want)
		}
		time.Sleep(50 * time.Millisecond)
	}
}
