package main

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"net"
	"net/http"
	"sync"
	"sync/atomic"
	"time"

	"github.com/soheilhy/cmux"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/types/known/wrapperspb"
)

// The demo's gRPC service, written by hand rather than generated: one
// unary method whose answer names the instance that served it.
const (
	demoGRPCService = "regdemo.v1.Demo"
	workMethod      = "/" + demoGRPCService + "/Work"
)

type worker interface {
	work(ctx context.Context, req *wrapperspb.StringValue) (*wrapperspb.StringValue, error)
}

var demoServiceDesc = grpc.ServiceDesc{
	ServiceName: demoGRPCService,
	HandlerType: (*worker)(nil),
	Methods:     []grpc.MethodDesc{{MethodName: "Work", Handler: workHandler}},
	Metadata:    "cmd/regdemo",
}

func workHandler(srv any, ctx context.Context, dec func(any) error, interceptor grpc.UnaryServerInterceptor) (any, error) {
	in := new(wrapperspb.StringValue)
	if err := dec(in); err != nil {
		return nil, err
	}
	if interceptor == nil {
		return srv.(worker).work(ctx, in)
	}
	info := &grpc.UnaryServerInfo{Server: srv, FullMethod: workMethod}
	return interceptor(ctx, in, info, func(ctx context.Context, req any) (any, error) {
		return srv.(worker).work(ctx, req.(*wrapperspb.StringValue))
	})
}

// Backend is one instance of the demo service, seed 001's service_a.py on
// our stack: a real gRPC server (Work) and, on the same port, the seed's
// HTTP endpoints: /health (500 while failing, which the registry's prober
// sees), /work, and /toggle_fail; and /stats. One port serves both because the
// registry's HTTP check probes the instance's own address.
type Backend struct {
	// ID is the instance id (A, B, C).
	ID string
	// Addr is the host:port of both gRPC and HTTP.
	Addr string

	failing  atomic.Bool
	served   atomic.Int64 // Work calls answered OK
	inflight atomic.Int64 // Work calls being served

	lis  net.Listener
	mux  cmux.CMux
	grpc *grpc.Server
	http *http.Server
	wg   sync.WaitGroup
}

// StartBackend serves instance id on a free loopback port.
func StartBackend(id string) (*Backend, error) {
	lis, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return nil, fmt.Errorf("backend %s: listen: %w", id, err)
	}
	b := &Backend{ID: id, Addr: lis.Addr().String(), lis: lis, mux: cmux.New(lis)}
	// A connection that sends nothing must not hold a sniffing goroutine
	// (and so Close) forever.
	b.mux.SetReadTimeout(5 * time.Second)
	// HTTP/1 methods first; gRPC is the HTTP/2 preface.
	httpL := b.mux.Match(cmux.HTTP1Fast())
	grpcL := b.mux.Match(cmux.HTTP2())

	b.grpc = grpc.NewServer()
	b.grpc.RegisterService(&demoServiceDesc, b)
	h := http.NewServeMux()
	h.HandleFunc("/health", b.handleHealth)
	h.HandleFunc("/work", b.handleWork)
	h.HandleFunc("/toggle_fail", b.handleToggle)
	h.HandleFunc("/stats", b.handleStats)
	b.http = &http.Server{Handler: h, ReadHeaderTimeout: 5 * time.Second}

	b.wg.Add(3)
	go func() { defer b.wg.Done(); _ = b.grpc.Serve(grpcL) }()
	go func() { defer b.wg.Done(); _ = b.http.Serve(httpL) }()
	go func() { defer b.wg.Done(); _ = b.mux.Serve() }()
	return b, nil
}

// Failing reports whether the backend is in fail mode.
func (b *Backend) Failing() bool { return b.failing.Load() }

// Served counts the Work calls answered OK.
func (b *Backend) Served() int64 { return b.served.Load() }

// slowWork is the request that takes slowWorkTime to serve: the story
// sends it while it kills C, so that C dies with a call in flight.
const (
	slowWork     = "slow"
	slowWorkTime = 300 * time.Millisecond
)

// work fails with Unavailable in fail mode: the code of an instance that
// cannot serve, which the balancer counts against it (an application
// error such as InvalidArgument would not eject it, seed 001's "a 400
// must not trip the breaker").
func (b *Backend) work(ctx context.Context, req *wrapperspb.StringValue) (*wrapperspb.StringValue, error) {
	b.inflight.Add(1)
	defer b.inflight.Add(-1)
	if b.failing.Load() {
		return nil, status.Errorf(codes.Unavailable, "instance %s is in fail mode (/toggle_fail)", b.ID)
	}
	if req.GetValue() == slowWork {
		t := time.NewTimer(slowWorkTime)
		defer t.Stop()
		select {
		case <-t.C:
		case <-ctx.Done():
			return nil, status.FromContextError(ctx.Err()).Err()
		}
	}
	b.served.Add(1)
	return wrapperspb.String(b.ID), nil
}

func writeJSON(w http.ResponseWriter, code int, v any) {
	w.Header().Set("Content-Type", "application/json")
	w.WriteHeader(code)
	_ = json.NewEncoder(w).Encode(v)
}

func (b *Backend) handleHealth(w http.ResponseWriter, _ *http.Request) {
	if b.failing.Load() {
		writeJSON(w, http.StatusInternalServerError, map[string]string{"status": "down"})
		return
	}
	writeJSON(w, http.StatusOK, map[string]string{"status": "up"})
}

func (b *Backend) handleWork(w http.ResponseWriter, _ *http.Request) {
	if b.failing.Load() {
		writeJSON(w, http.StatusInternalServerError, map[string]string{"instance": b.ID, "result": "error"})
		return
	}
	writeJSON(w, http.StatusOK, map[string]string{"instance": b.ID, "result": "ok"})
}

// handleStats is not the seed's: what the demo reads to time the kill of
// C with a call in flight.
func (b *Backend) handleStats(w http.ResponseWriter, _ *http.Request) {
	writeJSON(w, http.StatusOK, stats{FailMode: b.failing.Load(), Served: b.served.Load(), Inflight: b.inflight.Load()})
}

type stats struct {
	FailMode bool  `json:"fail_mode"`
	Served   int64 `json:"served"`
	Inflight int64 `json:"inflight"`
}

func (b *Backend) handleToggle(w http.ResponseWriter, _ *http.Request) {
	// Flip atomically: two toggles at once must not both read the old value.
	for {
		old := b.failing.Load()
		if b.failing.CompareAndSwap(old, !old) {
			writeJSON(w, http.StatusOK, map[string]bool{"fail_mode": !old})
			return
		}
	}
}

// Close stops both servers and waits for their goroutines. Connections
// are cut, not drained: the demo's client is gone, or it is the point.
func (b *Backend) Close() {
	b.grpc.Stop()
	_ = b.http.Close()
	b.mux.Close()
	_ = b.lis.Close()
	b.wg.Wait()
}

// newHTTPClient is the demo's client of the backends' HTTP endpoints:
// without keep-alive, so it holds no connection (and no goroutine) once
// a request is done.
func newHTTPClient() *http.Client {
	return &http.Client{Transport: &http.Transport{DisableKeepAlives: true}, Timeout: 5 * time.Second}
}

// toggleFail is the seed's `curl http://.../toggle_fail`: it flips the
// backend at addr and returns its new fail mode.
func toggleFail(ctx context.Context, hc *http.Client, addr string) (bool, error) {
	var out struct {
		FailMode bool `json:"fail_mode"`
	}
	if err := getJSON(ctx, hc, "http://"+addr+"/toggle_fail", &out); err != nil {
		return false, err
	}
	return out.FailMode, nil
}

// backendStats reads addr's /stats.
func backendStats(ctx context.Context, hc *http.Client, addr string) (stats, error) {
	var out stats
	err := getJSON(ctx, hc, "http://"+addr+"/stats", &out)
	return out, err
}

// isDown asks addr's /health, as the prober does.
func isDown(ctx context.Context, hc *http.Client, addr string) (bool, error) {
	ctx, cancel := context.WithTimeout(ctx, 5*time.Second)
	defer cancel()
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, "http://"+addr+"/health", nil)
	if err != nil {
		return false, err
	}
	resp, err := hc.Do(req)
	if err != nil {
		return false, fmt.Errorf("GET %s/health: %w", addr, err)
	}
	resp.Body.Close()
	return resp.StatusCode != http.StatusOK, nil
}

func getJSON(ctx context.Context, hc *http.Client, url string, v any) error {
	ctx, cancel := context.WithTimeout(ctx, 5*time.Second)
	defer cancel()
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, url, nil)
	if err != nil {
		return err
	}
	resp, err := hc.Do(req)
	if err != nil {
		return fmt.Errorf("GET %s: %w", url, err)
	}
	defer resp.Body.Close()
	if resp.StatusCode != http.StatusOK {
		return fmt.Errorf("GET %s: HTTP %d", url, resp.StatusCode)
	}
	if err := json.NewDecoder(resp.Body).Decode(v); err != nil {
		return fmt.Errorf("GET %s: %w", url, errors.Join(errors.New("bad JSON"), err))
	}
	return nil
}
