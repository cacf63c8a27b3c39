package prober_test

import (
	"context"
	"fmt"
	"net"
	"net/http"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	clientv3 "go.etcd.io/etcd/client/v3"
	"go.uber.org/goleak"
	"google.golang.org/grpc"
	grpchealth "google.golang.org/grpc/health"
	healthpb "google.golang.org/grpc/health/grpc_health_v1"
	"google.golang.org/protobuf/types/known/durationpb"
	"google.golang.org/protobuf/types/known/timestamppb"

	"github.com/regcluster/registry/client"
	"github.com/regcluster/registry/internal/etcdtest"
	"github.com/regcluster/registry/internal/regnodetest"
	"github.com/regcluster/registry/node"
	registryv1 "github.com/regcluster/registry/proto/registry/v1"
	"github.com/regcluster/registry/store"
)

func TestMain(m *testing.M) { goleak.VerifyTestMain(m, etcdtest.LeakOptions()...) }

const (
	healthy     = registryv1.HealthState_HEALTH_STATE_HEALTHY
	degraded    = registryv1.HealthState_HEALTH_STATE_DEGRADED
	unavailable = registryv1.HealthState_HEALTH_STATE_UNAVAILABLE
)

// fixture is a regnode probing every 100ms, and an API client.
type fixture struct {
	rn  *regnodetest.Regnode
	api registryv1.RegistryClient
}

func newFixture(t *testing.T) *fixture {
	t.Helper()
	m := etcdtest.Start(t, false)
	rn := regnodetest.StartWith(t, node.Config{EtcdEndpoints: []string{m.ClientURL}, Name: "prober-1",
		ProbeInterval: 100 * time.Millisecond, SessionTTL: 2 * time.Second}, m.ClientURL)
	c, err := client.New(client.Config{Endpoints: []string{rn.Addr}})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { c.Close() })
	return &fixture{rn: rn, api: c.API()}
}

func (f *fixture) register(t *testing.T, id, addr string, check *registryv1.HealthCheck) {
	t.Helper()
	if _, err := f.api.Register(context.Background(), &registryv1.RegisterRequest{Instance: &registryv1.Instance{
		Service: "orders", Id: id, Address: addr, Check: check}}); err != nil {
		t.Fatal(err)
	}
}

// await waits for the instance's health to reach state and returns it.
func (f *fixture) await(t *testing.T, id string, state registryv1.HealthState, d time.Duration) *registryv1.Health {
	t.Helper()
	deadline := time.Now().Add(d)
	var last *registryv1.Health
	for time.Now().Before(deadline) {
		g, err := f.api.Get(context.Background(), &registryv1.GetRequest{Service: "orders", Id: id})
		if err == nil {
			last = g.Instance.Health
			if last.GetState() == state {
				return last
			}
		}
		time.Sleep(20 * time.Millisecond)
	}
	t.Fatalf("%s did not reach %v within %s; last health %v", id, state, d, last)
	return nil
}

// history returns every health state the instance's key went through, in
// etcd's order (read from etcd's history).
func (f *fixture) history(t *testing.T, id string) []*registryv1.Health {
	t.Helper()
	st, err := store.New(store.Config{Client: f.rn.Etcd, Prefix: f.rn.Prefix})
	if err != nil {
		t.Fatal(err)
	}
	key := st.Keys().Instance("orders", id)
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	head, err := f.rn.Etcd.Get(ctx, key)
	if err != nil || len(head.Kvs) == 0 {
		t.Fatalf("read %s: %v", key, err)
	}
	var out []*registryv1.Health
	// Every version of the key, from etcd's history, up to the current one.
	for resp := range f.rn.Etcd.Watch(ctx, key, clientv3.WithRev(1)) {
		for _, ev := range resp.Events {
			if in, err := st.Keys().Decode(key, ev.Kv.Value, 0, 0); err == nil && in.Health != nil {
				if len(out) == 0 || out[len(out)-1].State != in.Health.State {
					out = append(out, in.Health)
				}
			}
			if ev.Kv.ModRevision >= head.Kvs[0].ModRevision {
				return out
			}
		}
	}
	t.Fatalf("history of %s: %v", key, ctx.Err())
	return out
}

// A TCP target: HEALTHY while it accepts, DEGRADED then UNAVAILABLE once
// it refuses, and back only through DEGRADED.
func TestTCPPath(t *testing.T) {
	f := newFixture(t)
	lis, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	addr := lis.Addr().String()
	stop := serveTCP(lis)
	f.register(t, "tcp-1", addr, &registryv1.HealthCheck{Kind: registryv1.CheckKind_CHECK_KIND_TCP})
	h := f.await(t, "tcp-1", healthy, 5*time.Second)
	if h.Observer != "prober-1" || h.Fence == 0 || h.Since == nil {
		t.Fatalf("health %v: want observer, fence and since", h)
	}
	stop()
	h = f.await(t, "tcp-1", degraded, 5*time.Second)
	if !strings.Contains(h.Reason, "connection refused") || !strings.Contains(h.Reason, "3 consecutive") {
		t.Fatalf("degraded reason %q", h.Reason)
	}
	h = f.await(t, "tcp-1", unavailable, 5*time.Second)
	if !strings.Contains(h.Reason, "5 consecutive") {
		t.Fatalf("unavailable reason %q", h.Reason)
	}
	lis, err = net.Listen("tcp", addr)
	if err != nil {
		t.Fatal(err)
	}
	defer serveTCP(lis)()
	f.await(t, "tcp-1", healthy, 10*time.Second)
	var seq []registryv1.HealthState
	for _, h := range f.history(t, "tcp-1") {
		seq = append(seq, h.State)
	}
	want := []registryv1.HealthState{healthy, degraded, unavailable, degraded, healthy}
	if fmt.Sprint(seq) != fmt.Sprint(want) {
		t.Fatalf("history %v, want %v (never UNAVAILABLE straight to HEALTHY)", seq, want)
	}
}

func serveTCP(lis net.Listener) (stop func()) {
	var wg sync.WaitGroup
	wg.Add(1)
	go func() {
		defer wg.Done()
		for {
			c, err := lis.Accept()
			if err != nil {
				return
			}
			c.Close()
		}
	}()
	return func() { lis.Close(); wg.Wait() }
}

// An HTTP target switched between 200, 503, slow and hung: each reaches the
// right state with the right reason.
func TestHTTPPath(t *testing.T) {
	f := newFixture(t)
	var mode atomic.Value
	mode.Store("ok")
	srv := &http.Server{Handler: http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		switch mode.Load() {
		case "503":
			w.WriteHeader(http.StatusServiceUnavailable)
		case "slow":
			time.Sleep(150 * time.Millisecond)
		case "hung":
			select {
			case <-time.After(2 * time.Second):
			case <-r.Context().Done():
			}
		}
	})}
	lis, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	go srv.Serve(lis)
	defer srv.Close()
	f.register(t, "http-1", lis.Addr().String(), &registryv1.HealthCheck{Kind: registryv1.CheckKind_CHECK_KIND_HTTP,
		Target: "/healthz", Timeout: durationpb.New(300 * time.Millisecond)})
	f.await(t, "http-1", healthy, 5*time.Second)

	mode.Store("slow")
	h := f.await(t, "http-1", degraded, 5*time.Second)
	if !strings.Contains(h.Reason, "slow threshold") {
		t.Fatalf("slow: reason %q", h.Reason)
	}
	mode.Store("ok")
	f.await(t, "http-1", healthy, 5*time.Second)

	mode.Store("503")
	f.await(t, "http-1", degraded, 5*time.Second)
	h = f.await(t, "http-1", unavailable, 5*time.Second)
	if !strings.Contains(h.Reason, "HTTP 503") {
		t.Fatalf("503: reason %q", h.Reason)
	}
	mode.Store("ok")
	f.await(t, "http-1", healthy, 10*time.Second)

	mode.Store("hung")
	f.await(t, "http-1", degraded, 10*time.Second)
	h = f.await(t, "http-1", unavailable, 10*time.Second)
	if !strings.Contains(h.Reason, "timeout") || strings.Contains(h.Reason, "HTTP") {
		t.Fatalf("hung: reason %q, want a timeout", h.Reason)
	}
}

// A gRPC target switched between SERVING and NOT_SERVING.
func TestGRPCPath(t *testing.T) {
	f := newFixture(t)
	lis, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	hs := grpchealth.NewServer()
	srv := grpc.NewServer()
	healthpb.RegisterHealthServer(srv, hs)
	go srv.Serve(lis)
	defer srv.Stop()
	hs.SetServingStatus("orders.v1", healthpb.HealthCheckResponse_SERVING)
	f.register(t, "grpc-1", lis.Addr().String(), &registryv1.HealthCheck{Kind: registryv1.CheckKind_CHECK_KIND_GRPC, Target: "orders.v1"})
	f.await(t, "grpc-1", healthy, 5*time.Second)
	hs.SetServingStatus("orders.v1", healthpb.HealthCheckResponse_NOT_SERVING)
	f.await(t, "grpc-1", degraded, 5*time.Second)
	h := f.await(t, "grpc-1", unavailable, 5*time.Second)
	if !strings.Contains(h.Reason, "NOT_SERVING") {
		t.Fatalf("reason %q", h.Reason)
	}
	hs.SetServingStatus("orders.v1", healthpb.HealthCheckResponse_SERVING)
	f.await(t, "grpc-1", degraded, 5*time.Second)
	f.await(t, "grpc-1", healthy, 5*time.Second)
}

// On taking over, the prober starts from the stored state: a healthy
// target stored as UNAVAILABLE climbs through DEGRADED.
func TestStartsFromStoredState(t *testing.T) {
	m := etcdtest.Start(t, false)
	cli := m.Client(t)
	st, err := store.New(store.Config{Client: cli})
	if err != nil {
		t.Fatal(err)
	}
	lis, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer serveTCP(lis)()
	ctx := context.Background()
	if _, err := st.Register(ctx, &registryv1.Instance{Service: "orders", Id: "s-1", Address: lis.Addr().String(),
		Check: &registryv1.HealthCheck{Kind: registryv1.CheckKind_CHECK_KIND_TCP}}, 0); err != nil {
		t.Fatal(err)
	}
	if _, _, err := st.Update(ctx, "orders", "s-1", func(in *registryv1.Instance) error {
		in.Health = &registryv1.Health{State: unavailable, Since: timestamppb.Now(), Reason: "stored"}
		return nil
	}); err != nil {
		t.Fatal(err)
	}
	rn := regnodetest.StartWith(t, node.Config{EtcdEndpoints: []string{m.ClientURL}, ProbeInterval: 100 * time.Millisecond}, m.ClientURL)
	c, err := client.New(client.Config{Endpoints: []string{rn.Addr}})
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	f := &fixture{rn: rn, api: c.API()}
	f.await(t, "s-1", healthy, 10*time.Second)
	var seq []registryv1.HealthState
	for _, h := range f.history(t, "s-1") {
		seq = append(seq, h.State)
	}
	if fmt.Sprint(seq) != fmt.Sprint([]registryv1.HealthState{unavailable, degraded, healthy}) {
		t.Fatalf("history %v: want UNAVAILABLE -> DEGRADED -> HEALTHY", seq)
	}
}
