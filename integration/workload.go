package integration

import (
	"context"
	"fmt"
	"math/rand/v2"
	"net"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/health"
	healthpb "google.golang.org/grpc/health/grpc_health_v1"
	"google.golang.org/grpc/status"

	"github.com/regcluster/registry/client"
	registryv1 "github.com/regcluster/registry/proto/registry/v1"
	"github.com/regcluster/registry/record"
)

// Backend is a gRPC server (grpc.health.v1) at an instance's address,
// whose health the workload switches; it records every call it serves.
type Backend struct {
	Addr string
	log  *callLog
	mu   sync.Mutex
	srv  *grpc.Server
}

// newBackend starts a backend on a free loopback port; it stops when the
// test ends.
func newBackend(t testing.TB, log *callLog) (*Backend, error) {
	lis, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return nil, fmt.Errorf("backend listener: %w", err)
	}
	b := &Backend{Addr: lis.Addr().String(), log: log}
	b.serve(lis)
	t.Cleanup(func() { b.Set(false) })
	return b, nil
}

func (b *Backend) serve(lis net.Listener) {
	b.srv = grpc.NewServer(grpc.UnaryInterceptor(b.log.interceptor(b.Addr)))
	healthpb.RegisterHealthServer(b.srv, health.NewServer())
	go b.srv.Serve(lis)
}

// Set brings the backend up or down.
func (b *Backend) Set(up bool) {
	b.mu.Lock()
	defer b.mu.Unlock()
	switch {
	case up && b.srv == nil:
		if lis, err := net.Listen("tcp", b.Addr); err == nil {
			b.serve(lis)
		}
	case !up && b.srv != nil:
		b.srv.Stop()
		b.srv = nil
	}
}

// Workload registers instances (some with checks on flapping backends,
// the others each on a backend of its own), closes them gracefully or lets
// them crash, drains and undrains them as an operator would, and writes
// junk, at random, until stopped; meanwhile its callers call the instances
// through the registry's resolver (callers.go).
type Workload struct {
	t         testing.TB
	endpoints []string
	keys      record.Keys
	ops       *client.Client // the operator's client
	backends  []*Backend
	rng       *rand.Rand

	mu   sync.Mutex
	regs map[string]*reg // open registrations by key
	seq  int
	// Counts of what was done.
	Registered, Graceful, Crashed, Drains, Undrains, Flaps, Junk int
	// Junk, if set, is called to write a junk record.
	JunkWriter func(key, value string) error
	// Meta is set on every instance registered (big values make big
	// records, to fill flow-control windows fast).
	Meta map[string]string
	// Callers is how many gRPC callers Run starts (default 2).
	Callers int
	calls   callLog
	name    string
}

type reg struct {
	r   *client.Registration
	c   *client.Client // its own client, so a crash can cut it alone
	cut *atomic.Bool   // set: every call of c fails, as if its process died
}

// crashable are the dial options of a client whose calls all fail once
// cut is set: Client.Close would otherwise drain and deregister its
// registration, which a crashed process cannot do.
func crashable(cut *atomic.Bool) []grpc.DialOption {
	errCut := status.Error(codes.Unavailable, "workload: the instance's process crashed")
	return []grpc.DialOption{
		grpc.WithChainUnaryInterceptor(func(ctx context.Context, method string, req, reply any, cc *grpc.ClientConn, invoker grpc.UnaryInvoker, opts ...grpc.CallOption) error {
			if cut.Load() {
				return errCut
			}
			return invoker(ctx, method, req, reply, cc, opts...)
		}),
		grpc.WithChainStreamInterceptor(func(ctx context.Context, desc *grpc.StreamDesc, cc *grpc.ClientConn, method string, streamer grpc.Streamer, opts ...grpc.CallOption) (grpc.ClientStream, error) {
			if cut.Load() {
				return nil, errCut
			}
			return streamer(ctx, desc, cc, method, opts...)
		}),
	}
}

// NewWorkload prepares a workload whose registrations and operator go
// through endpoints (regnode API addresses, or proxies in front of them).
func NewWorkload(t testing.TB, name string, endpoints []string, seed uint64) *Workload {
	ops, err := client.New(client.Config{Endpoints: endpoints})
	if err != nil {
		t.Fatal(err)
	}
	w := &Workload{t: t, endpoints: endpoints, keys: record.NewKeys(""), ops: ops,
		rng: rand.New(rand.NewPCG(seed, seed^0x9e3779b9)), regs: map[string]*reg{}, name: name, Callers: 2}
	for range 3 {
		b, err := newBackend(t, &w.calls)
		if err != nil {
			t.Fatal(err)
		}
		w.backends = append(w.backends, b)
	}
	t.Cleanup(w.close)
	return w
}

// Register adds one instance and returns its key: every other time with a
// TCP check on one of the flapping backends, else on a backend of its own
// (one address, one instance: a call it serves says which instance the
// caller routed to).
func (w *Workload) Register(ctx context.Context) (string, error) {
	w.mu.Lock()
	w.seq++
	id := fmt.Sprintf("%s-%03d", w.name, w.seq)
	meta := w.Meta
	b := w.backends[w.seq%len(w.backends)]
	withCheck := w.seq%2 == 0
	w.mu.Unlock()
	if !withCheck {
		// It keeps serving after the instance is closed or crashed: a
		// call that reaches it then is one the checker must see.
		var err error
		if b, err = newBackend(w.t, &w.calls); err != nil {
			return "", err
		}
	}
	cut := new(atomic.Bool)
	c, err := client.New(client.Config{Endpoints: w.endpoints, DialOptions: crashable(cut)})
	if err != nil {
		return "", err
	}
	in := &registryv1.Instance{Service: "orders", Id: id, Address: b.Addr, Zone: "z1", Metadata: meta}
	if withCheck {
		in.Check = &registryv1.HealthCheck{Kind: registryv1.CheckKind_CHECK_KIND_TCP}
	}
	rctx, cancel := context.WithTimeout(ctx, 10*time.Second)
	defer cancel()
	r, err := c.Register(rctx, in, client.RegisterOptions{TTL: 3 * time.Second, DrainGrace: 300 * time.Millisecond})
	if err != nil {
		c.Close()
		return "", err
	}
	key := w.keys.Instance("orders", id)
	w.mu.Lock()
	w.regs[key] = &reg{r: r, c: c, cut: cut}
	w.Registered++
	w.mu.Unlock()
	return key, nil
}

func (w *Workload) pick() (string, *reg) {
	w.mu.Lock()
	defer w.mu.Unlock()
	if len(w.regs) == 0 {
		return "", nil
	}
	n := w.rng.IntN(len(w.regs))
	for k, r := range w.regs {
		if n == 0 {
			return k, r
		}
		n--
	}
	return "", nil
}

// Step does one random action.
func (w *Workload) Step(ctx context.Context) {
	w.mu.Lock()
	roll := w.rng.IntN(100)
	n := len(w.regs)
	w.mu.Unlock()
	switch {
	case roll < 30 || n < 4:
		if _, err := w.Register(ctx); err != nil {
			w.t.Logf("workload: register: %v", err)
		}
	case roll < 45:
		if key, r := w.pick(); r != nil {
			w.forget(key)
			if err := r.r.Close(ctx); err != nil {
				w.t.Logf("workload: close %s: %v", key, err)
			}
			r.c.Close()
			w.mu.Lock()
			w.Graceful++
			w.mu.Unlock()
		}
	case roll < 50:
		if key, r := w.pick(); r != nil {
			// A crash: the process is gone, its lease expires on its own.
			// Its calls fail from now on; Close stops the registration's
			// loop without a drain or a deregister reaching regnode.
			w.forget(key)
			r.cut.Store(true)
			r.c.Close()
			w.mu.Lock()
			w.Crashed++
			w.mu.Unlock()
		}
	case roll < 70:
		if key, _ := w.pick(); key != "" {
			service, id, _ := w.keys.Parse(key)
			var err error
			if w.rng.IntN(2) == 0 {
				_, err = w.ops.API().Drain(ctx, &registryv1.DrainRequest{Service: service, Id: id, Reason: "workload"})
				w.count(&w.Drains)
			} else {
				_, err = w.ops.API().Undrain(ctx, &registryv1.UndrainRequest{Service: service, Id: id})
				w.count(&w.Undrains)
			}
			_ = err // NotFound while it re-registers, Unavailable during faults: both fine
		}
	case roll < 95:
		w.mu.Lock()
		b := w.backends[w.rng.IntN(len(w.backends))]
		up := w.rng.IntN(3) > 0
		w.Flaps++
		w.mu.Unlock()
		b.Set(up)
	default:
		if w.JunkWriter != nil {
			w.mu.Lock()
			w.Junk++
			k := w.keys.Instance("orders", fmt.Sprintf("junk-%d", w.Junk))
			w.mu.Unlock()
			if err := w.JunkWriter(k, "not a record"); err != nil {
				w.t.Logf("workload: %v", err) // etcd down during a fault: fine
			}
		}
	}
}

func (w *Workload) count(n *int) {
	w.mu.Lock()
	*n++
	w.mu.Unlock()
}

func (w *Workload) forget(key string) {
	w.mu.Lock()
	delete(w.regs, key)
	w.mu.Unlock()
}

// Run steps every interval, with the callers calling, until ctx ends.
func (w *Workload) Run(ctx context.Context, every time.Duration) {
	var callers sync.WaitGroup
	defer callers.Wait()
	for i := range w.Callers {
		callers.Add(1)
		go func() {
			defer callers.Done()
			w.caller(ctx, fmt.Sprintf("%s-caller%d", w.name, i))
		}()
	}
	t := time.NewTicker(every)
	defer t.Stop()
	for {
		select {
		case <-ctx.Done():
			return
		case <-t.C:
			w.Step(ctx)
		}
	}
}

// Open returns the keys of the registrations still open.
func (w *Workload) Open() []string {
	w.mu.Lock()
	defer w.mu.Unlock()
	var out []string
	for k := range w.regs {
		out = append(out, k)
	}
	return out
}

// Settle brings every backend up, so no instance is left flapping.
func (w *Workload) Settle() {
	for _, b := range w.backends {
		b.Set(true)
	}
}

// String summarizes what the workload did.
func (w *Workload) String() string {
	w.mu.Lock()
	defer w.mu.Unlock()
	w.calls.mu.Lock()
	calls, served := len(w.calls.calls), len(w.calls.served)
	w.calls.mu.Unlock()
	return fmt.Sprintf("%d registered, %d closed gracefully, %d crashed, %d drains, %d undrains, %d backend flaps, %d junk records, %d calls (%d served)",
		w.Registered, w.Graceful, w.Crashed, w.Drains, w.Undrains, w.Flaps, w.Junk, calls, served)
}

func (w *Workload) close() {
	w.mu.Lock()
	regs := w.regs
	w.regs = map[string]*reg{}
	w.mu.Unlock()
	for _, r := range regs {
		ctx, cancel := context.WithTimeout(context.Background(), 2*time.Second)
		r.r.Close(ctx)
		cancel()
		r.c.Close()
	}
	w.ops.Close()
}
