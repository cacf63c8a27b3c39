package balance_test

import (
	"context"
	"fmt"
	"os/exec"
	"sync"
	"sync/atomic"
	"syscall"
	"testing"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/credentials/insecure"
	healthpb "google.golang.org/grpc/health/grpc_health_v1"
	"google.golang.org/grpc/status"

	"github.com/regcluster/registry/balance"
)

// Every instance fails: each attempt of one call goes to a different
// instance (as the backends saw them), and a method not named idempotent
// is not retried once it reached an instance.
func TestRetriesGoToAnotherInstance(t *testing.T) {
	bs := startBackends(t, 3)
	p := balance.DefaultPolicy()
	p.Idempotent = []string{healthMethods}
	m := balance.NewMetrics()
	ch := newChannel(t, p, state(t, p, m, true, serving(bs[0], 100), serving(bs[1], 100), serving(bs[2], 100)))
	waitAllConnected(t, ch, bs)
	for _, b := range bs {
		b.failWith.Store(int32(codes.Unavailable))
	}
	for i := range 4 {
		id := fmt.Sprint("call-", i)
		if err := ch.check(id, 10*time.Second); status.Code(err) != codes.Unavailable {
			t.Fatalf("%s: %v", id, err)
		}
		for _, b := range bs {
			if n := b.sawCall(id); n != 1 {
				t.Fatalf("%s: %s saw %d attempts, want 1 (attempts go to distinct instances)", id, b.id, n)
			}
		}
	}
	if c := m.Counts(); c.Retries != 8 {
		t.Fatalf("%d retries for 4 calls, want 8", c.Retries)
	}
	// The picker's own record of the attempts, as an interceptor chained
	// after ours reads it (balance.Attempts): three, on three instances,
	// each sent and failed.
	var last []balance.Attempt
	sc, err := balance.ServiceConfig(p)
	if err != nil {
		t.Fatal(err)
	}
	cc, err := grpc.NewClient(ch.r.Scheme()+":///orders", grpc.WithResolvers(ch.r),
		grpc.WithTransportCredentials(insecure.NewCredentials()), grpc.WithDefaultServiceConfig(sc),
		grpc.WithChainUnaryInterceptor(balance.UnaryClientInterceptor(),
			func(ctx context.Context, method string, req, reply any, cc *grpc.ClientConn, invoker grpc.UnaryInvoker, opts ...grpc.CallOption) error {
				err := invoker(ctx, method, req, reply, cc, opts...)
				last = balance.Attempts(ctx) // the attempts are sequential: no race
				return err
			}))
	if err != nil {
		t.Fatal(err)
	}
	defer cc.Close()
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	if _, err := healthpb.NewHealthClient(cc).Check(ctx, &healthpb.HealthCheckRequest{}, grpc.WaitForReady(true)); status.Code(err) != codes.Unavailable {
		t.Fatal(err)
	}
	ids := map[string]bool{}
	for _, a := range last {
		ids[a.ID] = true
		if !a.Sent || status.Code(a.Err) != codes.Unavailable {
			t.Errorf("attempt %+v: want sent and failed with Unavailable", a)
		}
	}
	if len(last) != 3 || len(ids) != 3 {
		t.Fatalf("attempts recorded %+v, want 3 on 3 distinct instances", last)
	}

	p.Idempotent = nil
	ch2 := newChannel(t, p, state(t, p, m, true, serving(bs[0], 100), serving(bs[1], 100), serving(bs[2], 100)))
	before := m.Counts().Retries
	for i := range 20 {
		id := fmt.Sprint("once-", i)
		if err := ch2.check(id, 10*time.Second); status.Code(err) != codes.Unavailable {
			t.Fatalf("%s: %v", id, err)
		}
		seen := 0
		for _, b := range bs {
			seen += b.sawCall(id)
		}
		if seen != 1 {
			t.Fatalf("non-idempotent %s reached backends %d times", id, seen)
		}
	}
	if m.Counts().Retries != before {
		t.Fatal("a processed, non-idempotent call was retried")
	}
}

// A call that never reached an instance (the balancer had nothing
// connected) is retried even if not idempotent.
func TestUnprocessedCallIsRetried(t *testing.T) {
	b := startBackend(t, "b0")
	p := balance.DefaultPolicy()
	m := balance.NewMetrics()
	ch := newChannel(t, p, state(t, p, m, true, serving(b, 100)))
	waitAllConnected(t, ch, []*backend{b})
	b.srv.Stop()
	waitFor(t, 10*time.Second, "the failure to connect seen by the picker", func() bool {
		return status.Code(ch.check("", 5*time.Second)) == codes.Unavailable && m.Counts().NoInstance > 0
	})
	before := m.Counts().Retries
	if err := ch.check("", 5*time.Second); status.Code(err) != codes.Unavailable {
		t.Fatal(err)
	}
	if n := m.Counts().Retries - before; n != 2 {
		t.Fatalf("%d retries of an unprocessed call, want 2", n)
	}
	// The start of a stream likewise.
	before = m.Counts().Retries
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	if _, err := ch.hc.Watch(ctx, &healthpb.HealthCheckRequest{}); status.Code(err) != codes.Unavailable {
		t.Fatal(err)
	}
	if n := m.Counts().Retries - before; n != 2 {
		t.Fatalf("%d retries of an unprocessed stream start, want 2", n)
	}
}

// Every instance failing: retries stay within the budget (20% of calls
// plus 3/s over 10 s) and its exhaustion is counted.
func TestRetryBudget(t *testing.T) {
	bs := startBackends(t, 3)
	p := balance.DefaultPolicy()
	p.Idempotent = []string{healthMethods}
	p.ConsecutiveFailures = 1000 // keep ejection out of this count
	m := balance.NewMetrics()
	ch := newChannel(t, p, state(t, p, m, true, serving(bs[0], 100), serving(bs[1], 100), serving(bs[2], 100)))
	warmup := waitAllConnected(t, ch, bs)
	for _, b := range bs {
		b.failWith.Store(int32(codes.Unavailable))
	}
	const calls = 1000
	start := time.Now()
	for range calls {
		_ = ch.check("", 5*time.Second)
	}
	// The window may have slid during the run: bound by its length.
	windows := int64(time.Since(start)/p.RetryBudgetWindow) + 1
	c := m.Counts()
	limit := windows * ((calls+warmup)*int64(p.RetryBudgetPercent) + int64(p.RetryBudgetMinPerSecond)*10*100 + 99) / 100
	var attempts int64
	for _, b := range bs {
		attempts += b.calls.Load()
	}
	t.Logf("%d calls: %d retries (limit %d), budget exhausted %d times", calls, c.Retries, limit, c.BudgetExhausted)
	if c.Retries > limit || c.BudgetExhausted == 0 || attempts != calls+c.Retries {
		t.Fatalf("retries %d (limit %d), exhausted %d, attempts %d", c.Retries, limit, c.BudgetExhausted, attempts)
	}
}

// Against hanging backends a call returns at its deadline whatever the
// retries: attempts share the caller's deadline, so once it is over no
// retry is made. Counted, not timed: each call reaches exactly one
// backend and no retry is counted (a fresh timeout per attempt would give
// each call three attempts and three times the wait); the time is only
// bounded generously.
func TestDeadlineBoundsAllAttempts(t *testing.T) {
	bs := startBackends(t, 3)
	p := balance.DefaultPolicy()
	p.Idempotent = []string{healthMethods} // DeadlineExceeded is retryable
	m := balance.NewMetrics()
	ch := newChannel(t, p, state(t, p, m, true, serving(bs[0], 100), serving(bs[1], 100), serving(bs[2], 100)))
	waitAllConnected(t, ch, bs)
	for _, b := range bs {
		b.hang.Store(true)
	}
	for i := range 3 {
		id := fmt.Sprint("deadline-", i)
		start := time.Now()
		err := ch.check(id, 200*time.Millisecond)
		if status.Code(err) != codes.DeadlineExceeded {
			t.Fatal(err)
		}
		if d := time.Since(start); d > 2*time.Second { // generous: not a timing test
			t.Fatalf("a 200ms call took %v", d)
		}
		// The backend sees a call when it arrives; a retry after the
		// deadline would be a second arrival. Wait for the first (the
		// handler may run a moment after the client gave up).
		seen := func() int {
			n := 0
			for _, b := range bs {
				n += b.sawCall(id)
			}
			return n
		}
		waitFor(t, 10*time.Second, "the attempt seen by a backend", func() bool { return seen() > 0 })
		if n := seen(); n != 1 {
			t.Fatalf("%s: %d attempts reached the backends, want 1 (the deadline bounds all attempts)", id, n)
		}
	}
	if c := m.Counts(); c.Retries != 0 {
		t.Fatalf("%d retries past the caller's deadline", c.Retries)
	}
}

// kill -9 of a backend process under load, the instance still registered
// (HEALTHY in the registry until its lease would expire): with retries,
// no idempotent call fails.
func TestKillBackendProcessUnderLoad(t *testing.T) {
	var procs []*exec.Cmd
	var insts []inst
	for i := range 3 {
		cmd, b := startProcess(t, fmt.Sprint("p", i))
		procs = append(procs, cmd)
		insts = append(insts, serving(b, 100))
	}
	p := balance.DefaultPolicy()
	p.Idempotent = []string{healthMethods}
	m := balance.NewMetrics()
	ch := newChannel(t, p, state(t, p, m, true, insts...))
	waitFor(t, 10*time.Second, "three ready", func() bool { return len(m.Counts().Weights) == 3 })

	const workers, perWorker = 8, 400
	var (
		wg     sync.WaitGroup
		failed atomic.Int64
		done   atomic.Int64
		first  atomic.Value
	)
	for range workers {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for range perWorker {
				if err := ch.check("", 5*time.Second); err != nil {
					failed.Add(1)
					first.CompareAndSwap(nil, err.Error())
				}
				done.Add(1)
			}
		}()
	}
	waitFor(t, 30*time.Second, "load running", func() bool { return done.Load() > workers*perWorker/4 })
	if err := procs[0].Process.Signal(syscall.SIGKILL); err != nil {
		t.Fatal(err)
	}
	wg.Wait()
	c := m.Counts()
	t.Logf("%d calls, %d failed, %d retries, picks %v", done.Load(), failed.Load(), c.Retries, c.Picks)
	if failed.Load() != 0 {
		t.Fatalf("%d of %d idempotent calls failed across a kill -9 (first: %v)", failed.Load(), done.Load(), first.Load())
	}
	if c.Picks["orders/p0"] == 0 {
		t.Fatal("the killed backend never had traffic")
	}
}
