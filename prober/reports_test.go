package prober_test

import (
	"context"
	"io"
	"net"
	"net/http"
	"regexp"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	healthpb "google.golang.org/grpc/health/grpc_health_v1"
	"google.golang.org/grpc/metadata"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/types/known/durationpb"

	"github.com/regcluster/registry/client"
	"github.com/regcluster/registry/internal/node"
	"github.com/regcluster/registry/internal/regnodetest"
	registryv1 "github.com/regcluster/registry/proto/registry/v1"
)

// appBackend is a real gRPC server whose application is
// grpc.health.v1.Check: it answers SERVING, fails every call with
// Unavailable while failing is set, and fails the calls that carry
// x-fail-me (a caller whose calls fail everywhere).
type appBackend struct {
	healthpb.UnimplementedHealthServer
	addr    string
	failing atomic.Bool
}

func (b *appBackend) Check(ctx context.Context, _ *healthpb.HealthCheckRequest) (*healthpb.HealthCheckResponse, error) {
	md, _ := metadata.FromIncomingContext(ctx)
	if b.failing.Load() || len(md.Get("x-fail-me")) > 0 {
		return nil, status.Error(codes.Unavailable, "this instance fails its callers")
	}
	return &healthpb.HealthCheckResponse{Status: healthpb.HealthCheckResponse_SERVING}, nil
}

func newAppBackend(t *testing.T) *appBackend {
	t.Helper()
	lis, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	b := &appBackend{addr: lis.Addr().String()}
	srv := grpc.NewServer()
	healthpb.RegisterHealthServer(srv, b)
	go srv.Serve(lis)
	t.Cleanup(srv.Stop)
	return b
}

// caller is an SDK client calling orders through registry:/// in a loop
// until stopped, reporting every 200ms.
type caller struct {
	stop func()
}

func startCaller(t *testing.T, regnode, name string, failEverywhere bool) *caller {
	t.Helper()
	c, err := client.New(client.Config{Endpoints: []string{regnode}, Subscriber: name, ReportInterval: 200 * time.Millisecond})
	if err != nil {
		t.Fatal(err)
	}
	conn, err := grpc.NewClient("registry:///orders", c.DialOptions()...)
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	var wg sync.WaitGroup
	wg.Go(func() {
		h := healthpb.NewHealthClient(conn)
		for ctx.Err() == nil {
			cctx, ccancel := context.WithTimeout(ctx, time.Second)
			if failEverywhere {
				cctx = metadata.AppendToOutgoingContext(cctx, "x-fail-me", "1")
			}
			h.Check(cctx, &healthpb.HealthCheckRequest{})
			ccancel()
			select {
			case <-ctx.Done():
			case <-time.After(5 * time.Millisecond):
			}
		}
	})
	cl := &caller{stop: sync.OnceFunc(func() { cancel(); wg.Wait(); conn.Close(); c.Close() })}
	t.Cleanup(cl.stop)
	return cl
}

// metricSum sums the samples matching pattern on every regnode's /metrics.
func metricSum(t *testing.T, pattern string, rns ...*regnodetest.Regnode) int {
	t.Helper()
	line := regexp.MustCompile(`(?m)^` + pattern + ` (\d+)$`)
	n := 0
	for _, rn := range rns {
		resp, err := http.Get("http://" + rn.Node.MetricsAddr() + "/metrics")
		if err != nil {
			t.Fatal(err)
		}
		body, err := io.ReadAll(resp.Body)
		resp.Body.Close()
		if err != nil {
			t.Fatal(err)
		}
		for _, m := range line.FindAllStringSubmatch(string(body), -1) {
			v, _ := strconv.Atoi(m[1])
			n += v
		}
	}
	return n
}

// Callers' reports: an instance that fails every call with Unavailable
// while its probes pass becomes DEGRADED with the reason once 3 callers
// (through both regnodes, whichever owns it) report it, and HEALTHY again
// once it heals. Callers whose calls fail everywhere change nothing.
func TestCallersReportsDegrade(t *testing.T) {
	p := newPair(t, node.Config{ReportWindow: 2 * time.Second})
	good, bad := newAppBackend(t), newAppBackend(t)
	bad.failing.Store(true)
	recGood := recordKey(t, p.a.Etcd, p.a.Prefix, "good")
	recBad := recordKey(t, p.a.Etcd, p.a.Prefix, "bad")
	for id, b := range map[string]*appBackend{"good": good, "bad": bad} {
		if _, err := p.api.Register(context.Background(), &registryv1.RegisterRequest{Instance: &registryv1.Instance{
			Service: "orders", Id: id, Address: b.addr, Check: steady(registryv1.CheckKind_CHECK_KIND_TCP, "")},
			Ttl: durationpb.New(time.Hour)}); err != nil {
			t.Fatal(err)
		}
	}
	recGood.await(healthy, 30*time.Second)
	recBad.await(healthy, 30*time.Second)

	// Callers whose calls fail everywhere (even three of them, a
	// quorum) change nothing: their own network is the likelier cause.
	var lonely []*caller
	for i, rn := range []*regnodetest.Regnode{p.a, p.b, p.a} {
		lonely = append(lonely, startCaller(t, rn.Addr, "lonely-"+strconv.Itoa(i), true))
	}
	deadline := time.Now().Add(60 * time.Second)
	for metricSum(t, `registry_reports_total\{result="discounted"\}`, p.a, p.b) < 15 {
		if time.Now().After(deadline) {
			t.Fatal("the callers failing everywhere were never discounted 15 times")
		}
		time.Sleep(50 * time.Millisecond)
	}
	for _, l := range lonely {
		l.stop()
	}
	if got := recBad.states(); len(got) != 1 {
		t.Fatalf("bad's health after callers failing everywhere reported it: %v", got)
	}

	for i, rn := range []*regnodetest.Regnode{p.a, p.b, p.a} {
		startCaller(t, rn.Addr, "caller-"+strconv.Itoa(i), false)
	}
	h := recBad.await(degraded, 60*time.Second)
	if !strings.Contains(h.Reason, "failing calls from 3 clients; probes pass") {
		t.Fatalf("bad DEGRADED with reason %q", h.Reason)
	}
	bad.failing.Store(false)
	h = recBad.await(healthy, 60*time.Second)
	if !strings.Contains(h.Reason, "reports cleared") {
		t.Fatalf("bad HEALTHY again with reason %q", h.Reason)
	}
	if got := recGood.states(); len(got) != 1 {
		t.Fatalf("good's health changed: %v", got)
	}
	for _, s := range recBad.states() {
		if s == unavailable {
			t.Fatalf("reports made bad UNAVAILABLE: %v", recBad.states())
		}
	}
}
