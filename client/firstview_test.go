package client_test

import (
	"bufio"
	"context"
	"encoding/json"
	"fmt"
	"net"
	"os"
	"os/exec"
	"strings"
	"sync"
	"testing"
	"time"

	clientv3 "go.etcd.io/etcd/client/v3"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	healthpb "google.golang.org/grpc/health/grpc_health_v1"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/types/known/durationpb"

	"github.com/regcluster/registry/client"
	"github.com/regcluster/registry/internal/etcdtest"
	"github.com/regcluster/registry/internal/node"
	"github.com/regcluster/registry/internal/regnodetest"
	registryv1 "github.com/regcluster/registry/proto/registry/v1"
)

// notReached is the message of a fail-fast call on a channel whose
// registry was not reached within the connect timeout.
const notReached = "orders: registry not reached yet and no cached list"

// firstCalls is what the helper process of the first-call tests reports.
type firstCalls struct {
	OK, Failed int
	Err        string
}

// TestFirstCallsChild is the helper process of the first-call tests: a
// fresh process, as a user's would be, that creates its Client and a
// registry:///orders channel, says "up", and at once makes
// REGISTRY_FIRST_CALLS calls in parallel (fail-fast, each with a 30s
// deadline); then it prints their count as a JSON line and exits.
func TestFirstCallsChild(t *testing.T) {
	ep := os.Getenv("REGISTRY_FIRST_CHILD")
	if ep == "" {
		t.Skip("helper process of the first-call tests")
	}
	c, err := client.New(client.Config{Endpoints: []string{ep}})
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	cc, err := grpc.NewClient("registry:///orders", c.DialOptions()...)
	if err != nil {
		t.Fatal(err)
	}
	defer cc.Close()
	fmt.Println("up")
	hc := healthpb.NewHealthClient(cc)
	var n int
	fmt.Sscan(os.Getenv("REGISTRY_FIRST_CALLS"), &n)
	var (
		mu  sync.Mutex
		r   firstCalls
		all sync.WaitGroup
	)
	for range n {
		all.Go(func() {
			ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
			defer cancel()
			_, err := hc.Check(ctx, &healthpb.HealthCheckRequest{})
			mu.Lock()
			defer mu.Unlock()
			if err != nil {
				r.Failed++
				r.Err = err.Error()
				return
			}
			r.OK++
		})
	}
	all.Wait()
	if err := json.NewEncoder(os.Stdout).Encode(r); err != nil {
		t.Fatal(err)
	}
}

// firstCallsChild starts the helper process against endpoint and returns
// once it said "up", with a function that waits for its report.
func firstCallsChild(t *testing.T, endpoint string, calls int) func() firstCalls {
	t.Helper()
	child := exec.Command(os.Args[0], "-test.run=^TestFirstCallsChild$", "-test.count=1")
	child.Env = append(os.Environ(), "REGISTRY_FIRST_CHILD="+endpoint, fmt.Sprintf("REGISTRY_FIRST_CALLS=%d", calls))
	stdout, err := child.StdoutPipe()
	if err != nil {
		t.Fatal(err)
	}
	var stderr logBuf
	child.Stderr = &stderr
	if err := child.Start(); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = child.Process.Kill(); _ = child.Wait() })
	lines := bufio.NewScanner(stdout)
	for lines.Scan() && lines.Text() != "up" {
	}
	return func() firstCalls {
		t.Helper()
		for lines.Scan() {
			var r firstCalls
			if strings.HasPrefix(lines.Text(), "{") && json.Unmarshal(lines.Bytes(), &r) == nil {
				return r
			}
		}
		stderr.mu.Lock()
		defer stderr.mu.Unlock()
		t.Fatalf("the child reported nothing (stderr: %s)", stderr.b.String())
		return firstCalls{}
	}
}

// registerOrders registers three instances of orders, each a real
// backend, through the regnode at addr.
func registerOrders(t *testing.T, addr string) []*backend {
	t.Helper()
	api := newClient(t, addr).API()
	bs := []*backend{startBackend(t), startBackend(t), startBackend(t)}
	for i, b := range bs {
		register(t, api, fmt.Sprintf("b%d", i), b.addr, 100)
	}
	return bs
}

// The scenario: a fresh process creates its Client and channel
// and at once makes 100 calls in parallel against a healthy regnode;
// none fails, 20 times over. (Before, the first calls of each process
// failed "registry not reached yet".)
func TestFreshProcessFirstCallsSucceed(t *testing.T) {
	rn := regnodetest.Start(t)
	bs := registerOrders(t, rn.Addr)
	for i := range 20 {
		r := firstCallsChild(t, rn.Addr, 100)()
		if r.Failed != 0 || r.OK != 100 {
			t.Fatalf("process %d: %d calls ok, %d failed (%s)", i, r.OK, r.Failed, r.Err)
		}
	}
	var got int64
	for _, b := range bs {
		got += b.calls.Load()
	}
	if got != 2000 {
		t.Fatalf("the backends got %d calls, want 2000", got)
	}
}

// A regnode that starts only after the process made its calls: they wait
// for it (its first connection refused is retried) and none fails.
func TestFirstCallsWaitForALateRegnode(t *testing.T) {
	etcd := etcdtest.Start(t, false)
	cu := etcd.ClientURL
	first := regnodetest.StartExternal(t, cu)
	registerOrders(t, first.Addr)
	late := fmt.Sprintf("127.0.0.1:%d", etcdtest.FreePort(t))
	wait := firstCallsChild(t, late, 100) // its first connection is refused
	time.Sleep(500 * time.Millisecond)    // the scenario: the regnode starts 500ms after the process
	regnodetest.StartWith(t, node.Config{EtcdEndpoints: []string{cu}, Listen: late}, cu)
	if r := wait(); r.Failed != 0 || r.OK != 100 {
		t.Fatalf("%d calls ok, %d failed (%s)", r.OK, r.Failed, r.Err)
	}
}

// Every regnode down and no disk cache: a fail-fast call fails with the
// "registry not reached" message no sooner than the connect timeout and
// no later than twice it; a wait-for-ready call waits for its deadline.
func TestRegistryNotReachedAfterConnectTimeout(t *testing.T) {
	lis, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	dead := lis.Addr().String()
	lis.Close()
	c, err := client.New(client.Config{Endpoints: []string{dead}})
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	cc, err := grpc.NewClient("registry:///orders", c.DialOptions()...)
	if err != nil {
		t.Fatal(err)
	}
	defer cc.Close()
	hc := healthpb.NewHealthClient(cc)
	call := func(d time.Duration, opts ...grpc.CallOption) (error, time.Duration) {
		ctx, cancel := context.WithTimeout(context.Background(), d)
		defer cancel()
		start := time.Now()
		_, err := hc.Check(ctx, &healthpb.HealthCheckRequest{}, opts...)
		return err, time.Since(start)
	}
	// A wait-for-ready call made first waits past the connect timeout,
	// until its own deadline.
	wfr := make(chan error, 1)
	wfrDeadline := 2*client.DefaultConnectTimeout + time.Second
	go func() {
		err, took := call(wfrDeadline, grpc.WaitForReady(true))
		if err == nil && took < wfrDeadline {
			err = fmt.Errorf("returned after %v, before its deadline %v", took, wfrDeadline)
		}
		wfr <- err
	}()
	err, took := call(30 * time.Second)
	if status.Code(err) != codes.Unavailable || status.Convert(err).Message() != notReached {
		t.Fatalf("fail-fast call: %v, want Unavailable %q", err, notReached)
	}
	if took < client.DefaultConnectTimeout || took > 2*client.DefaultConnectTimeout {
		t.Fatalf("fail-fast call failed after %v, want between the connect timeout %v and twice it", took, client.DefaultConnectTimeout)
	}
	// Now known unreachable: the next fail-fast call fails at once (the
	// same message; no bound on "at once" but its 30s deadline).
	if err, _ := call(30 * time.Second); status.Convert(err).Message() != notReached {
		t.Fatalf("second fail-fast call: %v", err)
	}
	if err := <-wfr; status.Code(err) != codes.DeadlineExceeded {
		t.Fatalf("wait-for-ready call: %v, want DeadlineExceeded at its deadline", err)
	}
}

// A negative ConnectTimeout is refused, naming the field; the default
// is at most 2s.
func TestConnectTimeoutValidated(t *testing.T) {
	if _, err := client.New(client.Config{ConnectTimeout: -time.Second}); err == nil || !strings.Contains(err.Error(), "ConnectTimeout") {
		t.Fatalf("negative ConnectTimeout: %v", err)
	}
	if d := client.DefaultConfig().ConnectTimeout; d <= 0 || d > 2*time.Second {
		t.Fatalf("default ConnectTimeout %v", d)
	}
}

// The other first moments. A channel of a service the Client already
// follows is served at once; a channel built while the Client's stream
// moves off a regnode that stopped (of a service it follows, and of one
// it does not) waits for the stream to resume instead of failing; and
// the known view keeps serving calls through the failover.
func TestFirstCallsAroundFailover(t *testing.T) {
	etcd := etcdtest.Start(t, false)
	rnA := regnodetest.StartExternal(t, etcd.ClientURL)
	rnB := regnodetest.StartExternal(t, etcd.ClientURL)
	registerOrders(t, rnA.Addr)
	pay := startBackend(t)
	if _, err := newClient(t, rnA.Addr).API().Register(context.Background(), &registryv1.RegisterRequest{Ttl: durationpb.New(time.Minute),
		Instance: &registryv1.Instance{Service: "payments", Id: "p0", Address: pay.addr}}); err != nil {
		t.Fatal(err)
	}
	// Both regnodes hold the registrations: the Client's stream may start
	// on either (a view from one behind them is a true view of its
	// revision, and would serve "no instance" rightly).
	head, err := rnA.Etcd.Get(context.Background(), "/", clientv3.WithCountOnly())
	if err != nil {
		t.Fatal(err)
	}
	rnA.WaitRevision(t, head.Header.Revision)
	rnB.WaitRevision(t, head.Header.Revision)
	c := newClient(t, rnA.Addr, rnB.Addr)
	sub, err := c.Subscribe(context.Background(), "orders", client.SubscribeOptions{})
	if err != nil {
		t.Fatal(err)
	}
	defer sub.Close()
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	if err := sub.WaitReady(ctx); err != nil {
		t.Fatal(err)
	}
	dial := func(service string) healthpb.HealthClient {
		cc, err := grpc.NewClient("registry:///"+service, c.DialOptions()...)
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { cc.Close() })
		return healthpb.NewHealthClient(cc)
	}
	call := func(hc healthpb.HealthClient) error {
		ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
		defer cancel()
		_, err := hc.Check(ctx, &healthpb.HealthCheckRequest{})
		return err
	}
	// Already followed: each new channel's first call is served.
	for i := range 20 {
		if err := call(dial("orders")); err != nil {
			t.Fatalf("channel %d of a followed service, first call: %v", i, err)
		}
	}
	// Stop the regnode the Client's stream is on.
	var on, other *regnodetest.Regnode
	waitFor(t, 30*time.Second, "the stream on one regnode", func() bool {
		switch {
		case rnA.Node.Hub().Subscribers() > 0:
			on, other = rnA, rnB
		case rnB.Node.Hub().Subscribers() > 0:
			on, other = rnB, rnA
		}
		return on != nil
	})
	known := dial("orders")
	if err := call(known); err != nil {
		t.Fatal(err)
	}
	if err := on.Node.Close(); err != nil {
		t.Fatal(err)
	}
	// At once, while the stream moves: a known view serves, and channels
	// built now (a followed service, a new one) wait and are served.
	errs := make(chan error, 3)
	go func() { errs <- call(known) }()
	go func() { errs <- call(dial("orders")) }()
	go func() { errs <- call(dial("payments")) }()
	for range cap(errs) {
		if err := <-errs; err != nil {
			t.Fatalf("a call during the failover: %v", err)
		}
	}
	waitFor(t, 30*time.Second, "the stream on the other regnode", func() bool { return other.Node.Hub().Subscribers() > 0 })
	if pay.calls.Load() != 1 {
		t.Fatalf("payments got %d calls, want 1", pay.calls.Load())
	}
}
