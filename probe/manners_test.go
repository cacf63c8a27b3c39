package probe

import (
	"io"
	"net"
	"strings"
	"sync"
	"testing"
	"time"

	"go.uber.org/goleak"

	"github.com/regcluster/registry/health"
)

// agent is the tests' Agent, a regnode's.
var agent = Agent{Version: "0.1.0", Node: "rn-a/127.0.0.1:7400"}

// HTTP probes say who sends them: the User-Agent is exactly
// "regnode/<version> (<node>)"; without an Agent, DefaultAgent's.
func TestHTTPUserAgent(t *testing.T) {
	h := newHTTPTarget(t)
	spec := check(kindHTTP, "/healthz", 0)

	p := newChecker(t, Config{Agent: agent})
	want(t, p.Probe(t.Context(), h.addr, spec, noSlow), health.OK, "")
	if got, exp := h.userAgent.Load().(string), "regnode/0.1.0 (rn-a/127.0.0.1:7400)"; got != exp {
		t.Fatalf("User-Agent %q, want %q", got, exp)
	}

	d := newChecker(t, Config{})
	want(t, d.Probe(t.Context(), h.addr, spec, noSlow), health.OK, "")
	if got, exp := h.userAgent.Load().(string), "regnode/unknown (unnamed)"; got != exp {
		t.Fatalf("default User-Agent %q, want %q", got, exp)
	}
}

// gRPC probes send the same: user-agent starts with it (grpc-go appends
// its own name), and x-registry-prober names the node.
func TestGRPCUserAgent(t *testing.T) {
	g := newGRPCTarget(t, true)
	p := newChecker(t, Config{Agent: agent})
	want(t, p.Probe(t.Context(), g.addr, check(kindGRPC, "", 0), noSlow), health.OK, "")
	md := g.lastMD()
	ua := md.Get("user-agent")
	if len(ua) != 1 || !strings.HasPrefix(ua[0], "regnode/0.1.0 (rn-a/127.0.0.1:7400) grpc-go/") {
		t.Fatalf("user-agent %q, want regnode/0.1.0 (rn-a/127.0.0.1:7400) grpc-go/...", ua)
	}
	if got := md.Get(ProberMetadata); len(got) != 1 || got[0] != agent.Node {
		t.Fatalf("%s %q, want [%q]", ProberMetadata, got, agent.Node)
	}
}

// eofListener is a loopback target that accepts connections and closes
// each once the client has closed it (a server waiting for a request):
// the prober closes first, so a FIN would leave its socket in TIME_WAIT.
func eofListener(t testing.TB) string {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	var wg sync.WaitGroup
	wg.Add(1)
	go func() {
		defer wg.Done()
		for {
			c, err := ln.Accept()
			if err != nil {
				return
			}
			wg.Add(1)
			go func() {
				defer wg.Done()
				_ = c.SetReadDeadline(time.Now().Add(time.Minute))
				_, _ = io.Copy(io.Discard, c) // until the prober's FIN or reset
				_ = c.Close()
			}()
		}
	}()
	t.Cleanup(func() { _ = ln.Close(); wg.Wait() })
	return ln.Addr().String()
}

// A TCP probe closes with a reset: no socket of the prober's is left in
// TIME_WAIT. Without SO_LINGER 0 (the control) the same probes leave one
// per probe.
func TestTCPNoTimeWait(t *testing.T) {
	const probes = 5
	addr := eofListener(t)
	port := addrPort(t, addr)
	hostSockets(t) // skips off Linux
	p := newChecker(t, Config{})
	for range probes {
		want(t, p.Probe(t.Context(), addr, check(kindTCP, "", 0), noSlow), health.OK, "")
	}
	// The prober's ends vanish at once on a reset; wait (bounded) for any
	// that are still closing, then none may be in TIME_WAIT.
	var left map[string]int
	for deadline := time.Now().Add(5 * time.Second); ; {
		if left = proberSide(t, port); len(left) == 0 || time.Now().After(deadline) {
			break
		}
		time.Sleep(20 * time.Millisecond)
	}
	if n := left[tcpTimeWait]; n != 0 || len(left) != 0 {
		t.Fatalf("after %d probes with SO_LINGER 0, the prober's sockets to port %d by state: %v (%d TIME_WAIT), want none",
			probes, port, left, n)
	}

	// The control: the same probes closing with a FIN.
	addr = eofListener(t)
	port = addrPort(t, addr)
	fin := newChecker(t, Config{})
	fin.setNoLinger()
	for range probes {
		want(t, fin.Probe(t.Context(), addr, check(kindTCP, "", 0), noSlow), health.OK, "")
	}
	for deadline := time.Now().Add(10 * time.Second); proberSide(t, port)[tcpTimeWait] < probes; {
		if time.Now().After(deadline) {
			t.Fatalf("the control left %v sockets to port %d, want %d in TIME_WAIT: the test cannot see TIME_WAIT",
				proberSide(t, port), port, probes)
		}
		time.Sleep(20 * time.Millisecond)
	}
}

// HTTP probes of one target reuse one kept-alive connection, unless the
// target closes it.
func TestHTTPReuse(t *testing.T) {
	h := newHTTPTarget(t)
	p := newChecker(t, Config{})
	spec := check(kindHTTP, "/healthz", 0)
	for range 10 {
		want(t, p.Probe(t.Context(), h.addr, spec, noSlow), health.OK, "")
	}
	if n := h.accepted.Load(); n != 1 {
		t.Fatalf("10 probes took %d connections, want 1", n)
	}

	// A target that closes its connections gets a new one per probe: the
	// first of these probes goes over the kept one, which the target then
	// closes, and each of the 9 others opens one.
	h.set(modeClose)
	for range 10 {
		want(t, p.Probe(t.Context(), h.addr, spec, noSlow), health.OK, "")
	}
	if n := h.accepted.Load(); n != 10 {
		t.Fatalf("10 probes of a target closing its connections: %d connections in all, want 1+9", n)
	}

	// An unhealthy answer read whole keeps the connection too.
	h.set(mode503)
	before := h.accepted.Load()
	for range 5 {
		want(t, p.Probe(t.Context(), h.addr, spec, noSlow), health.Unhealthy, "HTTP 503")
	}
	if n := h.accepted.Load() - before; n > 1 {
		t.Fatalf("5 probes answered 503 took %d connections, want at most 1", n)
	}
}

// The gRPC connections cached are bounded: past the bound a probe uses a
// connection of its own, closed when it ends. Connections idle past the
// idle time are closed, and Close closes the rest and stops the sweeper:
// no goroutine is left.
func TestGRPCCacheBounded(t *testing.T) {
	defer goleak.VerifyNone(t, goleak.IgnoreCurrent())
	var targets []*grpcTarget
	for range 3 {
		targets = append(targets, newGRPCTarget(t, true))
	}
	p, err := New(Config{DefaultTimeout: steadyTimeout, Agent: agent})
	if err != nil {
		t.Fatal(err)
	}
	const idle = 300 * time.Millisecond
	p.setGRPCCache(2, idle)
	for range 3 {
		for _, g := range targets {
			want(t, p.Probe(t.Context(), g.addr, check(kindGRPC, "", 0), noSlow), health.OK, "")
			if n := p.cachedConns(); n > 2 {
				t.Fatalf("%d cached connections, bound 2", n)
			}
		}
	}
	if n := p.cachedConns(); n != 2 {
		t.Fatalf("%d cached connections, want the bound, 2", n)
	}

	// Unused, they are closed after the idle time (bounded wait).
	for deadline := time.Now().Add(10 * time.Second); p.cachedConns() != 0; {
		if time.Now().After(deadline) {
			t.Fatalf("%d cached connections still open 10s after their last probe (idle time %v)", p.cachedConns(), idle)
		}
		time.Sleep(20 * time.Millisecond)
	}
	// And made again when needed.
	want(t, p.Probe(t.Context(), targets[0].addr, check(kindGRPC, "", 0), noSlow), health.OK, "")
	if n := p.cachedConns(); n != 1 {
		t.Fatalf("%d cached connections, want 1", n)
	}
	if err := p.Close(); err != nil {
		t.Fatalf("Close: %v", err)
	}
	if n := p.cachedConns(); n != 0 {
		t.Fatalf("%d cached connections after Close", n)
	}
	for _, g := range targets {
		g.stop()
	}
}
