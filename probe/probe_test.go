package probe

import (
	"context"
	"errors"
	"fmt"
	"io"
	"net"
	"net/url"
	"os"
	"strings"
	"syscall"
	"testing"
	"time"

	healthpb "google.golang.org/grpc/health/grpc_health_v1"

	"github.com/regcluster/registry/health"
	registryv1 "github.com/regcluster/registry/proto/registry/v1"
)

const (
	kindNone = registryv1.CheckKind_CHECK_KIND_NONE
	kindTCP  = registryv1.CheckKind_CHECK_KIND_TCP
	kindHTTP = registryv1.CheckKind_CHECK_KIND_HTTP
	kindGRPC = registryv1.CheckKind_CHECK_KIND_GRPC

	noSlow = time.Hour // a slow threshold no loopback probe reaches
)

func TestTCP(t *testing.T) {
	p := newChecker(t, Config{})
	open, closed := tcpListener(t), closedAddr(t)

	r := p.Probe(t.Context(), open, check(kindTCP, "", 0), noSlow)
	want(t, r, health.OK, "")

	r = p.Probe(t.Context(), closed, check(kindTCP, "", 0), noSlow)
	want(t, r, health.Error, "connection refused")

	r = p.Probe(t.Context(), "127.0.0.1", check(kindTCP, "", 0), noSlow)
	want(t, r, health.Error, "address 127.0.0.1: missing port in address")
}

func TestHTTP(t *testing.T) {
	p := newChecker(t, Config{})
	h := newHTTPTarget(t)
	spec := check(kindHTTP, "/healthz", 2*time.Second)

	for _, tc := range []struct {
		mode    string
		outcome health.Outcome
		detail  string
	}{
		{modeOK, health.OK, ""},
		{mode503, health.Unhealthy, "HTTP 503"},
		{mode404, health.Unhealthy, "HTTP 404: the health endpoint's contract failed"},
		{modeRedirect, health.Unhealthy, "HTTP 302: redirects are not followed"},
		{modeBig, health.OK, ""},
		{modeOK, health.OK, ""}, // healthy again, on a kept-alive connection
	} {
		t.Run(tc.mode, func(t *testing.T) {
			h.set(tc.mode)
			want(t, p.Probe(t.Context(), h.addr, spec, noSlow), tc.outcome, tc.detail)
		})
	}

	// The target is a path; a missing leading '/' is added.
	h.set(modeOK)
	want(t, p.Probe(t.Context(), h.addr, check(kindHTTP, "healthz", 0), noSlow), health.OK, "")
	want(t, p.Probe(t.Context(), h.addr, check(kindHTTP, "/other", 0), noSlow),
		health.Unhealthy, "HTTP 404: the health endpoint's contract failed")
	want(t, p.Probe(t.Context(), h.addr, check(kindHTTP, "", 0), noSlow),
		health.Unhealthy, "HTTP 404: the health endpoint's contract failed")
}

func TestHTTPSlow(t *testing.T) {
	p := newChecker(t, Config{})
	h := newHTTPTarget(t)
	h.set(modeSlow)
	slow := 50 * time.Millisecond
	r := p.Probe(t.Context(), h.addr, check(kindHTTP, "/healthz", 5*time.Second), slow)
	want(t, r, health.Slow, "took *")
	if r.Latency < httpSlowFor {
		t.Fatalf("latency %v below the %v the server slept", r.Latency, httpSlowFor)
	}
	if exp := fmt.Sprintf("took %s, over the 50ms slow threshold", health.FormatDuration(r.Latency)); r.Detail != exp {
		t.Fatalf("detail %q, want %q", r.Detail, exp)
	}

	// The same answer is OK under a higher threshold.
	want(t, p.Probe(t.Context(), h.addr, check(kindHTTP, "/healthz", 5*time.Second), noSlow), health.OK, "")
}

func TestHTTPHung(t *testing.T) {
	p := newChecker(t, Config{DefaultTimeout: 200 * time.Millisecond})
	h := newHTTPTarget(t)
	h.set(modeHung)

	// The spec's timeout wins over the default.
	r := p.Probe(t.Context(), h.addr, check(kindHTTP, "/healthz", 300*time.Millisecond), time.Millisecond)
	want(t, r, health.Timeout, "timeout after 300ms")
	assertNear(t, r.Latency, 300*time.Millisecond)

	// Without one, the Config's default applies.
	r = p.Probe(t.Context(), h.addr, check(kindHTTP, "/healthz", 0), noSlow)
	want(t, r, health.Timeout, "timeout after 200ms")
	assertNear(t, r.Latency, 200*time.Millisecond)

	// A caller's earlier deadline is the probe's timeout: what is left of
	// it when the probe starts, at most what was left when Probe was
	// called (however long the machine took to get there), not the spec's
	// 5s.
	ctx, cancel := context.WithTimeout(t.Context(), 300*time.Millisecond)
	defer cancel()
	dl, _ := ctx.Deadline()
	leftAtCall := time.Until(dl)
	r = p.Probe(ctx, h.addr, check(kindHTTP, "/healthz", 5*time.Second), noSlow)
	want(t, r, health.Timeout, "timeout after *")
	left, err := time.ParseDuration(strings.TrimPrefix(r.Detail, "timeout after "))
	if err != nil || left > leftAtCall.Round(time.Millisecond) || left < 0 {
		t.Fatalf("detail %q: want what was left of the caller's deadline, at most %v", r.Detail, leftAtCall)
	}
	assertNear(t, r.Latency, left)

	// A canceled caller is not a timeout.
	ctx, cancel = context.WithCancel(t.Context())
	time.AfterFunc(50*time.Millisecond, cancel)
	r = p.Probe(ctx, h.addr, check(kindHTTP, "/healthz", 5*time.Second), noSlow)
	want(t, r, health.Error, "probe canceled")

	// Hung then healthy: the timed-out connection is not reused.
	h.set(modeOK)
	want(t, p.Probe(t.Context(), h.addr, check(kindHTTP, "/healthz", 0), noSlow), health.OK, "")
}

// assertNear checks that a probe that timed out waited its whole timeout
// (a timer never fires early; 5ms covers the rounding of the detail), and
// did not wait for another, much longer one: the tests' other timeouts are
// 5s and more, so the generous upper bound holds on a loaded machine too.
func assertNear(t testing.TB, latency, timeout time.Duration) {
	t.Helper()
	if latency < timeout-5*time.Millisecond || latency >= timeout+4*time.Second {
		t.Fatalf("latency %v for a %v timeout", latency, timeout)
	}
}

func TestHTTPRefused(t *testing.T) {
	p := newChecker(t, Config{})
	want(t, p.Probe(t.Context(), closedAddr(t), check(kindHTTP, "/healthz", 0), noSlow), health.Error, "connection refused")
}

// A server that answers garbage or hangs up is an error, not a timeout.
func TestHTTPClosedByTarget(t *testing.T) {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	done := make(chan struct{})
	go func() {
		defer close(done)
		for {
			c, err := ln.Accept()
			if err != nil {
				return
			}
			_, _ = c.Read(make([]byte, 1024))
			_ = c.Close()
		}
	}()
	t.Cleanup(func() { _ = ln.Close(); <-done })
	p := newChecker(t, Config{})
	want(t, p.Probe(t.Context(), ln.Addr().String(), check(kindHTTP, "/healthz", 0), noSlow),
		health.Error, "connection closed by the target")
}

func TestGRPC(t *testing.T) {
	p := newChecker(t, Config{})
	g := newGRPCTarget(t, true)

	want(t, p.Probe(t.Context(), g.addr, check(kindGRPC, "", 0), noSlow), health.OK, "")

	g.health.SetServingStatus("", healthpb.HealthCheckResponse_NOT_SERVING)
	want(t, p.Probe(t.Context(), g.addr, check(kindGRPC, "", 0), noSlow), health.Unhealthy, "NOT_SERVING")

	want(t, p.Probe(t.Context(), g.addr, check(kindGRPC, "orders", 0), noSlow), health.Unhealthy, "SERVICE_UNKNOWN")
	g.health.SetServingStatus("orders", healthpb.HealthCheckResponse_SERVING)
	want(t, p.Probe(t.Context(), g.addr, check(kindGRPC, "orders", 0), noSlow), health.OK, "")

	g.health.SetServingStatus("", healthpb.HealthCheckResponse_SERVING)
	want(t, p.Probe(t.Context(), g.addr, check(kindGRPC, "", 0), noSlow), health.OK, "")

	// Every probe went over one cached connection; Forget drops it.
	if n := p.cachedConns(); n != 1 {
		t.Fatalf("%d cached connections, want 1", n)
	}
	p.Forget(g.addr)
	if n := p.cachedConns(); n != 0 {
		t.Fatalf("%d cached connections after Forget, want 0", n)
	}
	want(t, p.Probe(t.Context(), g.addr, check(kindGRPC, "", 0), noSlow), health.OK, "")
}

func TestGRPCWithoutHealthService(t *testing.T) {
	p := newChecker(t, Config{})
	g := newGRPCTarget(t, false)
	want(t, p.Probe(t.Context(), g.addr, check(kindGRPC, "", 0), noSlow), health.Unhealthy, "health service not implemented")
}

func TestGRPCHung(t *testing.T) {
	p := newChecker(t, Config{})
	addr := hungListener(t)
	for range 2 { // the second probe waits on the same, still unanswered, connection
		r := p.Probe(t.Context(), addr, check(kindGRPC, "", 300*time.Millisecond), noSlow)
		want(t, r, health.Timeout, "timeout after 300ms")
		assertNear(t, r.Latency, 300*time.Millisecond)
	}
}

func TestGRPCRefusedThenBack(t *testing.T) {
	p := newChecker(t, Config{})
	addr := closedAddr(t)
	r := p.Probe(t.Context(), addr, check(kindGRPC, "", 0), noSlow)
	want(t, r, health.Error, "connection refused") // failed fast, not a wait for the timeout
	r = p.Probe(t.Context(), addr, check(kindGRPC, "", 0), noSlow)
	want(t, r, health.Error, "connection refused")

	// The instance comes back on the same address: the cached connection
	// must find it again (its backoff is capped at about a second; 30s only
	// bounds a broken test), not after minutes.
	ln, err := net.Listen("tcp", addr)
	if err != nil {
		t.Skipf("cannot listen again on %s: %v", addr, err)
	}
	serveGRPC(t, ln, true)
	back := time.Now()
	for {
		r = p.Probe(t.Context(), addr, check(kindGRPC, "", 0), noSlow)
		if r.Outcome == health.OK {
			break
		}
		if time.Since(back) > 30*time.Second {
			t.Fatalf("still %v %q %v after the server came back", r.Outcome, r.Detail, time.Since(back))
		}
		time.Sleep(100 * time.Millisecond)
	}
	t.Logf("healthy again after %v", time.Since(back).Round(time.Millisecond))
}

func TestNoCheck(t *testing.T) {
	p := newChecker(t, Config{})
	for _, spec := range []*registryv1.HealthCheck{nil, check(kindNone, "", 0)} {
		r := p.Probe(t.Context(), "unreachable.invalid:1", spec, noSlow)
		want(t, r, health.OK, "")
		if r.Latency != 0 {
			t.Fatalf("no check took %v", r.Latency)
		}
	}
	want(t, p.Probe(t.Context(), "127.0.0.1:1", check(registryv1.CheckKind(9), "", 0), noSlow),
		health.Error, "unsupported check kind 9")
}

func TestClose(t *testing.T) {
	h := newHTTPTarget(t)
	g := newGRPCTarget(t, true)
	d, err := New(Config{})
	if err != nil {
		t.Fatal(err)
	}
	if d.timeout != DefaultTimeout || d.Close() != nil {
		t.Fatalf("default timeout %v, want %v", d.timeout, DefaultTimeout)
	}
	p, err := New(Config{DefaultTimeout: steadyTimeout})
	if err != nil {
		t.Fatal(err)
	}
	want(t, p.Probe(t.Context(), g.addr, check(kindGRPC, "", 0), noSlow), health.OK, "")

	// Close waits for a probe in flight, then refuses new ones.
	h.set(modeHung)
	res := make(chan health.Result, 1)
	start := time.Now()
	go func() {
		res <- p.Probe(context.Background(), h.addr, check(kindHTTP, "/healthz", 300*time.Millisecond), noSlow)
	}()
	for h.requests.Load() == 0 {
		time.Sleep(time.Millisecond)
	}
	if err := p.Close(); err != nil {
		t.Fatalf("Close: %v", err)
	}
	// The hung probe cannot end before its 300ms timeout.
	if d := time.Since(start); d < 300*time.Millisecond {
		t.Fatalf("Close returned %v after the probe began, before the probe in flight ended", d)
	}
	want(t, <-res, health.Timeout, "timeout after 300ms")
	want(t, p.Probe(t.Context(), g.addr, check(kindGRPC, "", 0), noSlow), health.Error, "prober closed")
	want(t, p.Probe(t.Context(), h.addr, check(kindTCP, "", 0), noSlow), health.Error, "prober closed")
	if err := p.Close(); err != nil {
		t.Fatalf("second Close: %v", err)
	}
	p.Forget(g.addr) // harmless after Close
}

func TestDescribe(t *testing.T) {
	op := func(err error) error {
		return &url.Error{Op: "Get", URL: "http://x/", Err: &net.OpError{Op: "dial", Net: "tcp", Err: os.NewSyscallError("connect", err)}}
	}
	for _, tc := range []struct {
		err  error
		want string
	}{
		{op(syscall.ECONNREFUSED), "connection refused"},
		{op(syscall.ECONNRESET), "connection reset"},
		{op(syscall.EHOSTUNREACH), "no route to host"},
		{op(syscall.ENETUNREACH), "network is unreachable"},
		{&url.Error{Op: "Get", URL: "http://x/", Err: io.EOF}, "connection closed by the target"},
		{&net.OpError{Op: "dial", Net: "tcp", Err: &net.DNSError{Err: "no such host", Name: "nosuch.invalid", IsNotFound: true}},
			"DNS lookup of nosuch.invalid: no such host"},
		{&url.Error{Op: "Get", URL: "http://x/", Err: errors.New("malformed HTTP response")}, "malformed HTTP response"},
	} {
		if got := describe(tc.err); got != tc.want {
			t.Errorf("describe(%v) = %q, want %q", tc.err, got, tc.want)
		}
	}
}
