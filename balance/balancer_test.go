package balance_test

import (
	"math"
	"sync"
	"testing"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/connectivity"
	"google.golang.org/grpc/resolver"
	"google.golang.org/grpc/status"

	"github.com/regcluster/registry/balance"
	registryv1 "github.com/regcluster/registry/proto/registry/v1"
)

// Weights 100/100/200 split 4,000 sequential calls 25/25/50: within ±5
// points with P2C (a weighted draw), ±2 with smooth WRR.
func TestWeightedShares(t *testing.T) {
	for _, tc := range []struct {
		picker string
		slack  float64
	}{{balance.PickerP2C, 5}, {balance.PickerWRR, 2}} {
		t.Run(tc.picker, func(t *testing.T) {
			bs := startBackends(t, 3)
			p := balance.DefaultPolicy()
			p.Picker = tc.picker
			m := balance.NewMetrics()
			ch := newChannel(t, p, state(t, p, m, true, serving(bs[0], 100), serving(bs[1], 100), serving(bs[2], 200)))
			waitAllConnected(t, ch, bs)
			const n = 4000
			for i := range n {
				if err := ch.check("", 5*time.Second); err != nil {
					t.Fatalf("call %d: %v", i, err)
				}
			}
			want := []float64{25, 25, 50}
			for i, b := range bs {
				got := float64(b.calls.Load()) * 100 / n
				t.Logf("%s: %.1f%% (want %.0f±%.0f)", b.id, got, want[i], tc.slack)
				if math.Abs(got-want[i]) > tc.slack {
					t.Errorf("%s got %.1f%% of calls, want %.0f±%.0f", b.id, got, want[i], tc.slack)
				}
			}
			if c := m.Counts().Picks["orders/b2"]; c < n/2-n/10 {
				t.Errorf("pick counter of b2: %d", c)
			}
		})
	}
}

// A weight or health change is pushed without a reconnect; a drained
// instance gets no new call.
func TestAttributeChangeKeepsConnections(t *testing.T) {
	bs := startBackends(t, 2)
	p := balance.DefaultPolicy()
	ch := newChannel(t, p, state(t, p, nil, true, serving(bs[0], 100), serving(bs[1], 100)))
	waitAllConnected(t, ch, bs)
	degraded := serving(bs[1], 25)
	degraded.health = registryv1.HealthState_HEALTH_STATE_DEGRADED
	ch.r.UpdateState(state(t, p, nil, true, serving(bs[0], 300), degraded))
	draining := serving(bs[1], 25)
	draining.lifecycle = registryv1.Lifecycle_LIFECYCLE_DRAINING
	ch.r.UpdateState(state(t, p, nil, true, serving(bs[0], 300), draining))
	waitFor(t, 10*time.Second, "no call to the draining instance", func() bool {
		before := bs[1].calls.Load()
		for range 20 {
			if err := ch.check("", 5*time.Second); err != nil {
				t.Fatal(err)
			}
		}
		return bs[1].calls.Load() == before
	})
	for range 200 {
		if err := ch.check("", 5*time.Second); err != nil {
			t.Fatal(err)
		}
	}
	if n := bs[1].calls.Load(); n > 20 {
		t.Errorf("draining instance got calls after the drain was applied")
	}
	if a := bs[0].accepted.Load(); a != 1 {
		t.Errorf("b0 accepted %d connections across weight changes, want 1", a)
	}
}

// With nothing to call a call fails at once with Unavailable and a
// message that says why; a list the registry was not reached for is not
// an empty list.
func TestNothingToCallSaysWhy(t *testing.T) {
	bs := startBackends(t, 3)
	p := balance.DefaultPolicy()
	m := balance.NewMetrics()
	drain := func(b *backend) inst {
		in := serving(b, 100)
		in.lifecycle = registryv1.Lifecycle_LIFECYCLE_DRAINING
		return in
	}
	ch := newChannel(t, p, state(t, p, m, false))
	for _, tc := range []struct {
		st   resolver.State
		want string
	}{
		{unreached(state(t, p, m, false), ""), "orders: registry not reached yet and no cached list"},
		{unreached(state(t, p, m, false), "token has no read access"), "orders: the registry refused to follow it: token has no read access"},
		{state(t, p, m, true), "no instance of orders is registered"},
		{state(t, p, m, true, drain(bs[0]), drain(bs[1]), drain(bs[2])), "all 3 instances of orders are draining"},
	} {
		ch.r.UpdateState(tc.st)
		waitFor(t, 10*time.Second, tc.want, func() bool {
			// A long deadline: the answer must come from the picker at
			// once, not from the deadline.
			start := time.Now()
			err := ch.check("", 30*time.Second)
			if time.Since(start) > 10*time.Second {
				t.Fatalf("%q: the call waited for its deadline: %v", tc.want, err)
			}
			return status.Code(err) == codes.Unavailable && status.Convert(err).Message() == tc.want
		})
	}
	for _, b := range bs {
		if b.calls.Load() != 0 {
			t.Errorf("%s got a call", b.id)
		}
	}
	if m.Counts().NoInstance == 0 {
		t.Error("failed picks not counted")
	}
	// Back to one serving instance: calls flow again.
	ch.r.UpdateState(state(t, p, m, true, drain(bs[0]), serving(bs[1], 100)))
	if err := ch.check("", 10*time.Second, grpc.WaitForReady(true)); err != nil {
		t.Fatal(err)
	}
}

// Under concurrent load P2C's in-flight score moves calls away from a
// slow instance of equal weight.
func TestP2CAvoidsTheSlowInstance(t *testing.T) {
	bs := startBackends(t, 2)
	p := balance.DefaultPolicy()
	ch := newChannel(t, p, state(t, p, nil, true, serving(bs[0], 100), serving(bs[1], 100)))
	waitAllConnected(t, ch, bs)
	bs[1].delay.Store(int64(20 * time.Millisecond))
	var wg sync.WaitGroup
	for range 8 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for range 50 {
				if err := ch.check("", 5*time.Second); err != nil {
					t.Error(err)
					return
				}
			}
		}()
	}
	wg.Wait()
	fast, slow := bs[0].calls.Load(), bs[1].calls.Load()
	t.Logf("fast %d, slow %d", fast, slow)
	if slow*100 > 30*(fast+slow) {
		t.Fatalf("the slow instance got %d of %d calls, want < 30%%", slow, fast+slow)
	}
}

// unreached marks st's service as not known and unreached (refused "")
// or refused by the registry, as package client's resolver does once its
// connect timeout passed or a regnode refused the service.
func unreached(st resolver.State, refused string) resolver.State {
	svc := *balance.ServiceOf(st)
	svc.Unreached, svc.Refused = refused == "", refused
	return balance.WithService(st, &svc)
}

// Before the first view the channel is CONNECTING: a fail-fast call
// waits (here until its deadline), calls made while waiting are served
// once the view comes, and only "unreached" fails fail-fast calls at
// once, while a wait-for-ready call still waits for its deadline.
func TestFirstViewWaits(t *testing.T) {
	bs := startBackends(t, 1)
	p := balance.DefaultPolicy()
	m := balance.NewMetrics()
	ch := newChannel(t, p, state(t, p, m, false))
	err := ch.check("", 300*time.Millisecond)
	if status.Code(err) != codes.DeadlineExceeded {
		t.Fatalf("a fail-fast call before the first view: %v, want it to wait for its deadline", err)
	}
	if s := ch.cc.GetState(); s != connectivity.Connecting {
		t.Fatalf("channel %v before the first view, want CONNECTING", s)
	}
	// Calls made now wait, and are served by the view that comes.
	errs := make(chan error, 10)
	for range cap(errs) {
		go func() { errs <- ch.check("", time.Minute) }()
	}
	waitFor(t, 10*time.Second, "the calls to be waiting", func() bool {
		return bs[0].calls.Load() == 0 && m.Counts().NoInstance == 0 && ch.cc.GetState() == connectivity.Connecting
	})
	ch.r.UpdateState(state(t, p, m, true, serving(bs[0], 100)))
	for range cap(errs) {
		if err := <-errs; err != nil {
			t.Fatalf("a call made before the first view: %v", err)
		}
	}
	if n := bs[0].calls.Load(); n != int64(cap(errs)) {
		t.Fatalf("backend got %d calls, want %d", n, cap(errs))
	}

	// Unreached: fail-fast fails at once, wait-for-ready waits.
	ch2 := newChannel(t, p, unreached(state(t, p, m, false), ""))
	waitFor(t, 10*time.Second, "TRANSIENT_FAILURE", func() bool {
		err := ch2.check("", time.Minute)
		return status.Code(err) == codes.Unavailable && ch2.cc.GetState() == connectivity.TransientFailure
	})
	if err := ch2.check("", 300*time.Millisecond, grpc.WaitForReady(true)); status.Code(err) != codes.DeadlineExceeded {
		t.Fatalf("a wait-for-ready call while unreached: %v, want it to wait for its deadline", err)
	}
}
