package balance_test

import (
	"bufio"
	"context"
	"fmt"
	"net"
	"os"
	"os/exec"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"go.uber.org/goleak"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/credentials/insecure"
	healthpb "google.golang.org/grpc/health/grpc_health_v1"
	"google.golang.org/grpc/metadata"
	"google.golang.org/grpc/resolver"
	"google.golang.org/grpc/resolver/manual"
	"google.golang.org/grpc/status"

	"github.com/regcluster/registry/balance"
	registryv1 "github.com/regcluster/registry/proto/registry/v1"
)

func TestMain(m *testing.M) {
	if os.Getenv(helperEnv) != "" {
		serveHelper() // a backend process for the kill -9 test
		return
	}
	goleak.VerifyTestMain(m)
}

const helperEnv = "BALANCE_TEST_BACKEND_PROCESS"

// serveHelper is the backend process: a gRPC health server on a loopback
// port it prints, until killed.
func serveHelper() {
	lis, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		os.Exit(1)
	}
	srv := grpc.NewServer()
	healthpb.RegisterHealthServer(srv, healthServer{b: &backend{id: os.Getenv(helperEnv), callIDs: map[string]int{}}})
	fmt.Println(lis.Addr().String())
	_ = srv.Serve(lis)
	os.Exit(0)
}

// startProcess runs a backend in a process of its own (this test binary)
// and returns it with its address; it is killed when the test ends.
func startProcess(t *testing.T, id string) (*exec.Cmd, *backend) {
	t.Helper()
	cmd := exec.Command(os.Args[0], "-test.run=^$")
	cmd.Env = append(os.Environ(), helperEnv+"="+id)
	out, err := cmd.StdoutPipe()
	if err != nil {
		t.Fatal(err)
	}
	cmd.Stderr = os.Stderr
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = cmd.Process.Kill(); _ = cmd.Wait() })
	line, err := bufio.NewReader(out).ReadString('\n')
	if err != nil {
		t.Fatalf("backend process %s: %v", id, err)
	}
	return cmd, &backend{id: id, addr: strings.TrimSpace(line)}
}

// backend is a real gRPC server on loopback answering the health Check
// method. It fails every call with its code while one is set, counts the
// calls it answered, the connections it accepted, and records the call
// ids (metadata "call-id") it saw.
type backend struct {
	id       string
	addr     string
	srv      *grpc.Server
	calls    atomic.Int64
	accepted atomic.Int64
	failWith atomic.Int32 // codes.Code; OK: answer
	hang     atomic.Bool  // never answer (until the caller gives up)
	delay    atomic.Int64 // answer after this long (ns)

	mu      sync.Mutex
	callIDs map[string]int
}

type countingListener struct {
	net.Listener
	n *atomic.Int64
}

func (l countingListener) Accept() (net.Conn, error) {
	c, err := l.Listener.Accept()
	if err == nil {
		l.n.Add(1)
	}
	return c, err
}

type healthServer struct {
	healthpb.UnimplementedHealthServer
	b *backend
}

func (h healthServer) Check(ctx context.Context, _ *healthpb.HealthCheckRequest) (*healthpb.HealthCheckResponse, error) {
	b := h.b
	b.calls.Add(1)
	if md, ok := metadata.FromIncomingContext(ctx); ok && len(md.Get("call-id")) > 0 {
		b.mu.Lock()
		b.callIDs[md.Get("call-id")[0]]++
		b.mu.Unlock()
	}
	if d := b.delay.Load(); d > 0 {
		time.Sleep(time.Duration(d))
	}
	if b.hang.Load() {
		<-ctx.Done()
		return nil, ctx.Err()
	}
	if c := codes.Code(b.failWith.Load()); c != codes.OK {
		return nil, status.Errorf(c, "backend %s fails with %v", b.id, c)
	}
	return &healthpb.HealthCheckResponse{Status: healthpb.HealthCheckResponse_SERVING}, nil
}

func startBackend(t testing.TB, id string) *backend {
	t.Helper()
	lis, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	b := &backend{id: id, addr: lis.Addr().String(), srv: grpc.NewServer(), callIDs: map[string]int{}}
	healthpb.RegisterHealthServer(b.srv, healthServer{b: b})
	done := make(chan struct{})
	go func() { defer close(done); _ = b.srv.Serve(countingListener{lis, &b.accepted}) }()
	t.Cleanup(func() { b.srv.Stop(); <-done })
	return b
}

func startBackends(t *testing.T, n int) []*backend {
	var bs []*backend
	for i := range n {
		bs = append(bs, startBackend(t, fmt.Sprintf("b%d", i)))
	}
	return bs
}

func (b *backend) sawCall(id string) int {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.callIDs[id]
}

// inst describes one instance for a resolver state.
type inst struct {
	b         *backend
	weight    uint32
	health    registryv1.HealthState
	lifecycle registryv1.Lifecycle
	since     time.Time
	zone      string
}

func serving(b *backend, w uint32) inst {
	return inst{b: b, weight: w, health: registryv1.HealthState_HEALTH_STATE_HEALTHY, lifecycle: registryv1.Lifecycle_LIFECYCLE_SERVING}
}

// state builds the resolver state package client's resolver builds:
// routable instances as endpoints, the others as standby, draining ones
// only counted.
func state(t *testing.T, p balance.Policy, m *balance.Metrics, known bool, insts ...inst) resolver.State {
	t.Helper()
	return zoneState(t, "", m, known, insts...)
}

// zoneState is state with the caller in zone.
func zoneState(t *testing.T, zone string, m *balance.Metrics, known bool, insts ...inst) resolver.State {
	t.Helper()
	svc := &balance.Service{Name: "orders", Known: known, Registered: len(insts), Metrics: m, LocalZone: zone}
	var eps []resolver.Endpoint
	for _, in := range insts {
		routable := in.lifecycle == registryv1.Lifecycle_LIFECYCLE_SERVING && in.health != registryv1.HealthState_HEALTH_STATE_UNAVAILABLE
		ep := balance.WithInstance(resolver.Endpoint{Addresses: []resolver.Address{{Addr: in.b.addr}}}, balance.Instance{
			ID: in.b.id, Zone: in.zone, Weight: in.weight, Health: in.health, Lifecycle: in.lifecycle, Routable: routable, RoutableSince: in.since})
		switch {
		case in.lifecycle == registryv1.Lifecycle_LIFECYCLE_DRAINING:
			// As a standby endpoint, unlike package client's resolver:
			// the balancer must refuse it by itself.
			svc.Draining++
			svc.Standby = append(svc.Standby, ep)
		case routable:
			eps = append(eps, ep)
		default:
			svc.Standby = append(svc.Standby, ep)
		}
	}
	return balance.WithService(resolver.State{Endpoints: eps}, svc)
}

// channel is a real ClientConn over a manual resolver, with the policy
// as its service config and the retry interceptors.
type channel struct {
	cc *grpc.ClientConn
	r  *manual.Resolver
	hc healthpb.HealthClient
}

var schemes atomic.Int64

func newChannel(t *testing.T, p balance.Policy, first resolver.State) *channel {
	t.Helper()
	sc, err := balance.ServiceConfig(p)
	if err != nil {
		t.Fatal(err)
	}
	r := manual.NewBuilderWithScheme(fmt.Sprintf("test%d", schemes.Add(1)))
	r.InitialState(first)
	cc, err := grpc.NewClient(r.Scheme()+":///orders", grpc.WithResolvers(r),
		grpc.WithTransportCredentials(insecure.NewCredentials()),
		grpc.WithDefaultServiceConfig(sc),
		grpc.WithChainUnaryInterceptor(balance.UnaryClientInterceptor()),
		grpc.WithChainStreamInterceptor(balance.StreamClientInterceptor()))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { cc.Close() })
	cc.Connect()
	return &channel{cc: cc, r: r, hc: healthpb.NewHealthClient(cc)}
}

// check makes one call with a call id, a deadline and the given options.
func (c *channel) check(id string, d time.Duration, opts ...grpc.CallOption) error {
	ctx, cancel := context.WithTimeout(context.Background(), d)
	defer cancel()
	if id != "" {
		ctx = metadata.AppendToOutgoingContext(ctx, "call-id", id)
	}
	_, err := c.hc.Check(ctx, &healthpb.HealthCheckRequest{}, opts...)
	return err
}

// waitFor polls cond until it holds or the time is up.
func waitFor(t *testing.T, d time.Duration, what string, cond func() bool) {
	t.Helper()
	deadline := time.Now().Add(d)
	for !cond() {
		if time.Now().After(deadline) {
			t.Fatalf("timed out waiting for %s", what)
		}
		time.Sleep(5 * time.Millisecond)
	}
}

// waitAllConnected waits until a call succeeds on every backend of bs
// and returns the number of calls it made.
func waitAllConnected(t *testing.T, c *channel, bs []*backend) int64 {
	t.Helper()
	var n int64
	waitFor(t, 10*time.Second, "every backend answering", func() bool {
		_ = c.check("", 2*time.Second, grpc.WaitForReady(true))
		n++
		for _, b := range bs {
			if b.calls.Load() == 0 {
				return false
			}
		}
		return true
	})
	for _, b := range bs {
		b.calls.Store(0)
	}
	return n
}
