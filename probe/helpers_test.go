package probe

import (
	"context"
	"errors"
	"net"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"google.golang.org/grpc"
	grpchealth "google.golang.org/grpc/health"
	healthpb "google.golang.org/grpc/health/grpc_health_v1"
	"google.golang.org/grpc/metadata"
	"google.golang.org/protobuf/types/known/durationpb"

	"github.com/regcluster/registry/health"
	registryv1 "github.com/regcluster/registry/proto/registry/v1"
)

// steadyTimeout is the default probe timeout of the tests' probers: far
// above anything a loopback target takes on a loaded machine, so a probe
// expected to answer never times out instead.
const steadyTimeout = 10 * time.Second

// newChecker returns a Checker closed when the test ends (before the servers
// the test started earlier). Its default timeout is steadyTimeout unless
// cfg sets one.
func newChecker(t testing.TB, cfg Config) *Checker {
	t.Helper()
	if cfg.DefaultTimeout == 0 {
		cfg.DefaultTimeout = steadyTimeout
	}
	p, err := New(cfg)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		if err := p.Close(); err != nil {
			t.Errorf("Close: %v", err)
		}
	})
	return p
}

// check returns a spec of kind with target and timeout (0: unset).
func check(kind registryv1.CheckKind, target string, timeout time.Duration) *registryv1.HealthCheck {
	c := &registryv1.HealthCheck{Kind: kind, Target: target}
	if timeout > 0 {
		c.Timeout = durationpb.New(timeout)
	}
	return c
}

// want asserts a result's outcome and detail (a detail ending in "*" is a
// prefix), and that its latency and time are plausible.
func want(t testing.TB, r health.Result, outcome health.Outcome, detail string) {
	t.Helper()
	ok := r.Detail == detail
	if p, isPrefix := strings.CutSuffix(detail, "*"); isPrefix {
		ok = strings.HasPrefix(r.Detail, p)
	}
	if r.Outcome != outcome || !ok {
		t.Fatalf("result %v %q (latency %v), want %v %q", r.Outcome, r.Detail, r.Latency, outcome, detail)
	}
	if r.Latency < 0 || r.At.IsZero() {
		t.Fatalf("result latency %v at %v", r.Latency, r.At)
	}
}

// tcpListener is a loopback TCP listener that accepts and closes
// connections until the test ends.
func tcpListener(t testing.TB) string {
	t.Helper()
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
			_ = c.Close()
		}
	}()
	t.Cleanup(func() { _ = ln.Close(); <-done })
	return ln.Addr().String()
}

// closedAddr returns a loopback address nothing listens on: connections
// are refused.
func closedAddr(t testing.TB) string {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	addr := ln.Addr().String()
	_ = ln.Close()
	return addr
}

// hungListener accepts TCP connections and never writes a byte; it closes
// them when the test ends.
func hungListener(t testing.TB) string {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	var (
		mu    sync.Mutex
		conns []net.Conn
		done  = make(chan struct{})
	)
	go func() {
		defer close(done)
		for {
			c, err := ln.Accept()
			if err != nil {
				return
			}
			mu.Lock()
			conns = append(conns, c)
			mu.Unlock()
		}
	}()
	t.Cleanup(func() {
		_ = ln.Close()
		<-done
		mu.Lock()
		defer mu.Unlock()
		for _, c := range conns {
			_ = c.Close()
		}
	})
	return ln.Addr().String()
}

// The modes of httpTarget.
const (
	modeOK       = "ok"       // 200 with a short body
	modeBig      = "big"      // 200 with a 1 MiB body
	mode503      = "503"      // 503
	mode404      = "404"      // 404
	modeRedirect = "redirect" // 302 to another host
	modeSlow     = "slow"     // 200 after httpSlowFor
	modeHung     = "hung"     // no answer until the client gives up
	modeClose    = "close"    // 200, closing the connection after it
)

const httpSlowFor = 150 * time.Millisecond

// httpTarget is a loopback HTTP server answering on /healthz as its mode
// says, and 404 on any other path. It records the User-Agent of the last
// request and counts the connections it accepted.
type httpTarget struct {
	addr      string
	mode      atomic.Value // string
	requests  atomic.Int64
	accepted  atomic.Int64
	userAgent atomic.Value // string
}

func newHTTPTarget(t testing.TB) *httpTarget {
	t.Helper()
	h := &httpTarget{}
	h.mode.Store(modeOK)
	h.userAgent.Store("")
	srv := httptest.NewUnstartedServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		h.requests.Add(1)
		h.userAgent.Store(r.UserAgent())
		if r.URL.Path != "/healthz" || r.Method != http.MethodGet {
			http.NotFound(w, r)
			return
		}
		switch h.mode.Load().(string) {
		case modeOK:
			_, _ = w.Write([]byte("ok\n"))
		case modeClose:
			w.Header().Set("Connection", "close")
			_, _ = w.Write([]byte("ok\n"))
		case modeBig:
			_, _ = w.Write(make([]byte, 1<<20))
		case mode503:
			http.Error(w, "draining", http.StatusServiceUnavailable)
		case mode404:
			http.NotFound(w, r)
		case modeRedirect:
			http.Redirect(w, r, "http://198.51.100.1/healthz", http.StatusFound)
		case modeSlow:
			select {
			case <-time.After(httpSlowFor):
			case <-r.Context().Done():
			}
			_, _ = w.Write([]byte("ok\n"))
		case modeHung:
			select {
			case <-time.After(time.Minute):
			case <-r.Context().Done():
			}
		}
	}))
	srv.Config.ConnState = func(_ net.Conn, s http.ConnState) {
		if s == http.StateNew {
			h.accepted.Add(1)
		}
	}
	srv.Start()
	t.Cleanup(srv.Close)
	h.addr = srv.Listener.Addr().String()
	return h
}

func (h *httpTarget) set(mode string) { h.mode.Store(mode) }

// grpcTarget is a loopback gRPC server, with grpc-go's health service
// unless withHealth is false. It records the metadata of the last call.
type grpcTarget struct {
	addr   string
	health *grpchealth.Server
	stop   func()

	mu sync.Mutex
	md metadata.MD
}

// lastMD is the metadata of the last call the target received.
func (g *grpcTarget) lastMD() metadata.MD {
	g.mu.Lock()
	defer g.mu.Unlock()
	return g.md
}

func newGRPCTarget(t testing.TB, withHealth bool) *grpcTarget {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	return serveGRPC(t, ln, withHealth)
}

func serveGRPC(t testing.TB, ln net.Listener, withHealth bool) *grpcTarget {
	t.Helper()
	g := &grpcTarget{addr: ln.Addr().String()}
	srv := grpc.NewServer(grpc.UnaryInterceptor(func(ctx context.Context, req any, _ *grpc.UnaryServerInfo, h grpc.UnaryHandler) (any, error) {
		md, _ := metadata.FromIncomingContext(ctx)
		g.mu.Lock()
		g.md = md
		g.mu.Unlock()
		return h(ctx, req)
	}))
	if withHealth {
		g.health = grpchealth.NewServer() // the overall service "" is SERVING
		healthpb.RegisterHealthServer(srv, g.health)
	}
	done := make(chan struct{})
	go func() {
		defer close(done)
		if err := srv.Serve(ln); err != nil && !errors.Is(err, grpc.ErrServerStopped) {
			t.Errorf("gRPC Serve: %v", err)
		}
	}()
	var once sync.Once
	g.stop = func() { once.Do(func() { srv.Stop(); <-done }) }
	t.Cleanup(g.stop)
	return g
}
