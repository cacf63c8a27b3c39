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
	"google.golang.org/protobuf/proto"
	"google.golang.org/protobuf/types/known/durationpb"
	"google.golang.org/protobuf/types/known/timestamppb"

	"github.com/regcluster/registry/client"
	"github.com/regcluster/registry/internal/etcdtest"
	"github.com/regcluster/registry/internal/node"
	"github.com/regcluster/registry/internal/regnodetest"
	registryv1 "github.com/regcluster/registry/proto/registry/v1"
	"github.com/regcluster/registry/record"
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

// recorder keeps every version of one instance's key, read from etcd's
// history by a watch from revision 1, so a test waits on the sequence of
// writes the prober made, not on polls that can miss a short state.
type recorder struct {
	t        *testing.T
	id       string
	mu       sync.Mutex
	versions []*registryv1.Instance // every put, in etcd's order
	err      error
	cursor   int // await looks from here on
	changed  chan struct{}
}

// record starts recording id's key; it stops when the test ends.
func (f *fixture) record(t *testing.T, id string) *recorder {
	t.Helper()
	return recordKey(t, f.rn.Etcd, f.rn.Prefix, id)
}

func recordKey(t *testing.T, cli *clientv3.Client, prefix, id string) *recorder {
	t.Helper()
	keys := record.NewKeys(prefix)
	key := keys.Instance("orders", id)
	r := &recorder{t: t, id: id, changed: make(chan struct{}, 1)}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan struct{})
	wch := cli.Watch(ctx, key, clientv3.WithRev(1))
	go func() {
		defer close(done)
		for resp := range wch {
			r.mu.Lock()
			if err := resp.Err(); err != nil && r.err == nil {
				r.err = err
			}
			for _, ev := range resp.Events {
				if ev.Type != clientv3.EventTypePut {
					continue
				}
				in, err := keys.Decode(key, ev.Kv.Value, ev.Kv.CreateRevision, ev.Kv.ModRevision)
				if err != nil {
					r.err = fmt.Errorf("version at %d: %w", ev.Kv.ModRevision, err)
					continue
				}
				r.versions = append(r.versions, in)
			}
			r.mu.Unlock()
			select {
			case r.changed <- struct{}{}:
			default:
			}
		}
	}()
	t.Cleanup(func() { cancel(); <-done })
	return r
}

// await waits until a health write of state comes after the one the last
// await returned, and returns it. d only bounds a test that is broken.
func (r *recorder) await(state registryv1.HealthState, d time.Duration) *registryv1.Health {
	r.t.Helper()
	deadline := time.NewTimer(d)
	defer deadline.Stop()
	for {
		r.mu.Lock()
		err := r.err
		for i := r.cursor; i < len(r.versions); i++ {
			if h := r.versions[i].GetHealth(); h != nil && h.State == state {
				r.cursor = i + 1
				r.mu.Unlock()
				return h
			}
		}
		r.mu.Unlock()
		if err != nil {
			r.t.Fatalf("history of %s: %v", r.id, err)
		}
		select {
		case <-r.changed:
		case <-deadline.C:
			r.t.Fatalf("%s: no %v written within %s; health written: %v", r.id, state, d, r.states())
		}
	}
}

// healths returns every health the prober wrote, one per write, in order.
func (r *recorder) healths() []*registryv1.Health {
	r.mu.Lock()
	defer r.mu.Unlock()
	var out []*registryv1.Health
	var last *registryv1.Health
	for _, in := range r.versions {
		if h := in.GetHealth(); h != nil && !proto.Equal(h, last) {
			out = append(out, h)
			last = h
		}
	}
	return out
}

func (r *recorder) states() []registryv1.HealthState {
	var out []registryv1.HealthState
	for _, h := range r.healths() {
		out = append(out, h.State)
	}
	return out
}

// allowed lists every transition the prober may write.
var allowed = map[[2]registryv1.HealthState]bool{
	{healthy, degraded}: true, {degraded, healthy}: true,
	{degraded, unavailable}: true, {unavailable, degraded}: true,
}

// checkHistory asserts the health writes hold want in order (a machine
// slowed by load may flap more, never less), and that every write is a
// transition: never the same state twice in a row, never a jump such as
// UNAVAILABLE -> HEALTHY.
func (r *recorder) checkHistory(want ...registryv1.HealthState) {
	r.t.Helper()
	got := r.states()
	i := 0
	for _, s := range got {
		if i < len(want) && s == want[i] {
			i++
		}
	}
	if i < len(want) {
		r.t.Fatalf("%s: health written %v, does not hold %v in order", r.id, got, want)
	}
	for j := 1; j < len(got); j++ {
		if !allowed[[2]registryv1.HealthState{got[j-1], got[j]}] {
			r.t.Fatalf("%s: health written %v: write %d (%v -> %v) is not a transition the machine makes", r.id, got, j, got[j-1], got[j])
		}
	}
}

// steady is a check spec whose slow threshold and timeout are far from
// what loopback targets do, so a loaded machine cannot turn an answer into
// a slow or timed-out probe.
func steady(kind registryv1.CheckKind, target string) *registryv1.HealthCheck {
	return &registryv1.HealthCheck{Kind: kind, Target: target,
		Timeout: durationpb.New(2 * time.Second), SlowThreshold: durationpb.New(time.Second)}
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
	rec := f.record(t, "tcp-1")
	f.register(t, "tcp-1", addr, steady(registryv1.CheckKind_CHECK_KIND_TCP, ""))
	h := rec.await(healthy, 30*time.Second)
	if h.Observer != "prober-1" || h.Fence == 0 || h.Since == nil {
		t.Fatalf("health %v: want observer, fence and since", h)
	}
	stop()
	h = rec.await(degraded, 30*time.Second)
	if !strings.Contains(h.Reason, "connection refused") || !strings.Contains(h.Reason, "3 consecutive") {
		t.Fatalf("degraded reason %q", h.Reason)
	}
	h = rec.await(unavailable, 30*time.Second)
	if !strings.Contains(h.Reason, "5 consecutive") {
		t.Fatalf("unavailable reason %q", h.Reason)
	}
	lis, err = net.Listen("tcp", addr)
	if err != nil {
		t.Fatal(err)
	}
	defer serveTCP(lis)()
	rec.await(degraded, 30*time.Second)
	rec.await(healthy, 30*time.Second)
	rec.checkHistory(healthy, degraded, unavailable, degraded, healthy)
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
	// The slow threshold (300ms), the slow answer (700ms) and the timeout
	// (1.5s) are far apart, so load cannot move a probe from one kind to
	// another; counts of 2 keep the hung phase short.
	srv := &http.Server{Handler: http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		switch mode.Load() {
		case "503":
			w.WriteHeader(http.StatusServiceUnavailable)
		case "slow":
			select {
			case <-time.After(700 * time.Millisecond):
			case <-r.Context().Done():
			}
		case "hung":
			<-r.Context().Done()
		}
	})}
	lis, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	go srv.Serve(lis)
	defer srv.Close()
	rec := f.record(t, "http-1")
	f.register(t, "http-1", lis.Addr().String(), &registryv1.HealthCheck{Kind: registryv1.CheckKind_CHECK_KIND_HTTP,
		Target: "/healthz", Timeout: durationpb.New(1500 * time.Millisecond), SlowThreshold: durationpb.New(300 * time.Millisecond),
		FailuresToDegraded: 2, FailuresToUnavailable: 2, SuccessesToHealthy: 2, SuccessesToDegraded: 2})
	rec.await(healthy, 30*time.Second)

	mode.Store("slow")
	h := rec.await(degraded, 30*time.Second)
	if !strings.Contains(h.Reason, "slow threshold") {
		t.Fatalf("slow: reason %q", h.Reason)
	}
	mode.Store("ok")
	rec.await(healthy, 30*time.Second)

	mode.Store("503")
	rec.await(degraded, 30*time.Second)
	h = rec.await(unavailable, 30*time.Second)
	if !strings.Contains(h.Reason, "HTTP 503") {
		t.Fatalf("503: reason %q", h.Reason)
	}
	mode.Store("ok")
	rec.await(degraded, 30*time.Second)
	rec.await(healthy, 30*time.Second)

	mode.Store("hung")
	rec.await(degraded, 30*time.Second)
	h = rec.await(unavailable, 30*time.Second)
	if !strings.Contains(h.Reason, "timeout") || strings.Contains(h.Reason, "HTTP") {
		t.Fatalf("hung: reason %q, want a timeout", h.Reason)
	}
	rec.checkHistory(healthy, degraded, healthy, degraded, unavailable, degraded, healthy, degraded, unavailable)
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
	rec := f.record(t, "grpc-1")
	f.register(t, "grpc-1", lis.Addr().String(), steady(registryv1.CheckKind_CHECK_KIND_GRPC, "orders.v1"))
	rec.await(healthy, 30*time.Second)
	hs.SetServingStatus("orders.v1", healthpb.HealthCheckResponse_NOT_SERVING)
	rec.await(degraded, 30*time.Second)
	h := rec.await(unavailable, 30*time.Second)
	if !strings.Contains(h.Reason, "NOT_SERVING") {
		t.Fatalf("reason %q", h.Reason)
	}
	hs.SetServingStatus("orders.v1", healthpb.HealthCheckResponse_SERVING)
	rec.await(degraded, 30*time.Second)
	rec.await(healthy, 30*time.Second)
	rec.checkHistory(healthy, degraded, unavailable, degraded, healthy)
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
	rec := recordKey(t, cli, record.DefaultPrefix, "s-1")
	if _, err := st.Register(ctx, &registryv1.Instance{Service: "orders", Id: "s-1", Address: lis.Addr().String(),
		Check: steady(registryv1.CheckKind_CHECK_KIND_TCP, "")}, 0); err != nil {
		t.Fatal(err)
	}
	if _, _, err := st.Update(ctx, "orders", "s-1", func(in *registryv1.Instance) error {
		in.Health = &registryv1.Health{State: unavailable, Since: timestamppb.Now(), Reason: "stored"}
		return nil
	}); err != nil {
		t.Fatal(err)
	}
	regnodetest.StartWith(t, node.Config{EtcdEndpoints: []string{m.ClientURL}, ProbeInterval: 100 * time.Millisecond}, m.ClientURL)
	if h := rec.await(unavailable, 30*time.Second); h.Reason != "stored" {
		t.Fatalf("first health %v, want the stored one", h)
	}
	rec.await(degraded, 30*time.Second)
	rec.await(healthy, 30*time.Second)
	if got := rec.states(); fmt.Sprint(got[:3]) != fmt.Sprint([]registryv1.HealthState{unavailable, degraded, healthy}) {
		t.Fatalf("history %v: want UNAVAILABLE -> DEGRADED -> HEALTHY first", got)
	}
	rec.checkHistory(unavailable, degraded, healthy)
}
