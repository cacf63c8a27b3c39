package balance_test

import (
	"fmt"
	"testing"
	"time"

	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	"github.com/regcluster/registry/balance"
	registryv1 "github.com/regcluster/registry/proto/registry/v1"
)

const healthMethods = "/grpc.health.v1.Health/*"

// A backend that fails with Unavailable while the registry still says
// HEALTHY is ejected; afterwards it only gets half-open calls; with
// retries callers see ≥ 99.5% success; healed, it comes back and ramps.
func TestFailingInstanceIsEjectedAndComesBack(t *testing.T) {
	bs := startBackends(t, 4)
	p := balance.DefaultPolicy()
	p.Idempotent = []string{healthMethods}
	p.BaseEjection = 300 * time.Millisecond // half-open calls within the test
	m := balance.NewMetrics()
	var insts []inst
	for _, b := range bs {
		insts = append(insts, serving(b, 100))
	}
	ch := newChannel(t, p, state(t, p, m, true, insts...))
	waitAllConnected(t, ch, bs)
	sick := bs[0]
	sick.failWith.Store(int32(codes.Unavailable))

	ok, failed := 0, 0
	call := func(n int) {
		for range n {
			if err := ch.check("", 5*time.Second); err != nil {
				failed++
			} else {
				ok++
			}
		}
	}
	call(100)
	if m.Counts().Ejections == 0 {
		t.Fatalf("not ejected after 100 calls (the sick one got %d)", sick.calls.Load())
	}
	// Ejected (once the picker without it is in place): every call the
	// sick one still gets is a half-open probe.
	waitFor(t, 10*time.Second, "a picker without the ejected one", func() bool {
		_, in := m.Counts().Weights["orders/b0"]
		return !in
	})
	c0, p0 := sick.calls.Load(), m.Counts().HalfOpenProbes
	call(1900)
	if got, probes := sick.calls.Load()-c0, m.Counts().HalfOpenProbes-p0; got != probes {
		t.Errorf("ejected backend got %d calls, %d of them half-open probes", got, probes)
	}
	if m.Counts().HalfOpenProbes == 0 || m.Counts().Ejections < 2 {
		t.Errorf("no half-open probe failed and re-ejected: %+v", m.Counts())
	}
	t.Logf("while ejected: %d of %d calls succeeded, %+v", ok, ok+failed, m.Counts())
	if rate := float64(ok) * 100 / float64(ok+failed); rate < 99.5 {
		t.Errorf("success %.2f%% (%d failed of %d), want ≥ 99.5%%", rate, failed, ok+failed)
	}
	// Healed: it comes back after its ejection, on a slow start (5% of
	// its weight first, where it had 25%).
	sick.failWith.Store(int32(codes.OK))
	waitFor(t, 30*time.Second, "the healed backend back", func() bool {
		call(10)
		return m.Counts().Returns > 0
	})
	c0 = sick.calls.Load()
	call(1000)
	if got := sick.calls.Load() - c0; got == 0 || got > 100 {
		t.Errorf("returned backend got %d of 1000 calls, want a slow start's few (≈16)", got)
	}
	if failed > 10 {
		t.Errorf("%d calls failed", failed)
	}
}

// An application error is a healthy instance answering: it ejects
// nothing and is not retried.
func TestApplicationErrorNeitherEjectsNorRetries(t *testing.T) {
	bs := startBackends(t, 3)
	p := balance.DefaultPolicy()
	p.Idempotent = []string{healthMethods}
	m := balance.NewMetrics()
	ch := newChannel(t, p, state(t, p, m, true, serving(bs[0], 100), serving(bs[1], 100), serving(bs[2], 100)))
	waitAllConnected(t, ch, bs)
	bs[0].failWith.Store(int32(codes.InvalidArgument))
	invalid := 0
	for i := range 300 {
		id := fmt.Sprint("call-", i)
		err := ch.check(id, 5*time.Second)
		if status.Code(err) == codes.InvalidArgument {
			invalid++
		} else if err != nil {
			t.Fatal(err)
		}
		seen := 0
		for _, b := range bs {
			seen += b.sawCall(id)
		}
		if seen != 1 {
			t.Fatalf("%s reached backends %d times", id, seen)
		}
	}
	if invalid < 50 {
		t.Fatalf("only %d InvalidArgument answers: the failing backend got no share", invalid)
	}
	if c := m.Counts(); c.Ejections != 0 || c.Retries != 0 {
		t.Fatalf("InvalidArgument ejected or retried: %+v", c)
	}
}

// At most MaxEjectionPercent of the instances are ejected at once, and
// the refused ejections are counted.
func TestEjectionCap(t *testing.T) {
	bs := startBackends(t, 4)
	p := balance.DefaultPolicy()
	p.Idempotent = []string{healthMethods}
	p.PanicThresholdPercent = 0
	m := balance.NewMetrics()
	var insts []inst
	for _, b := range bs {
		insts = append(insts, serving(b, 100))
	}
	ch := newChannel(t, p, state(t, p, m, true, insts...))
	waitAllConnected(t, ch, bs)
	for _, b := range bs[:3] {
		b.failWith.Store(int32(codes.ResourceExhausted))
	}
	waitFor(t, 10*time.Second, "a capped ejection", func() bool {
		_ = ch.check("", 5*time.Second)
		return m.Counts().EjectionsCapped > 0
	})
	if c := m.Counts(); c.Ejections != 2 {
		t.Fatalf("%d ejections of 3 failing among 4 (cap 50%%): %+v", c.Ejections, c)
	}
}

// 3 of 4 instances UNAVAILABLE in the registry: below the panic
// threshold, calls spread over all 4, and the panic counter moves; back
// above it, panic mode ends.
func TestPanicModeSpreadsOverAll(t *testing.T) {
	bs := startBackends(t, 4)
	p := balance.DefaultPolicy()
	m := balance.NewMetrics()
	down := func(b *backend) inst {
		in := serving(b, 100)
		in.health = registryv1.HealthState_HEALTH_STATE_UNAVAILABLE
		return in
	}
	ch := newChannel(t, p, state(t, p, m, true, serving(bs[0], 100), down(bs[1]), down(bs[2]), down(bs[3])))
	waitAllConnected(t, ch, bs)
	for range 400 {
		if err := ch.check("", 5*time.Second); err != nil {
			t.Fatal(err)
		}
	}
	for _, b := range bs {
		if n := b.calls.Load(); n < 50 {
			t.Errorf("%s got %d of 400 calls in panic mode", b.id, n)
		}
	}
	if c := m.Counts(); c.PanicEnters != 1 || c.Panicking != 1 {
		t.Fatalf("panic not counted once: %+v", c)
	}
	ch.r.UpdateState(state(t, p, m, true, serving(bs[0], 100), serving(bs[1], 100), down(bs[2]), down(bs[3])))
	waitFor(t, 10*time.Second, "panic mode over", func() bool { return m.Counts().PanicLeaves == 1 })
	for _, b := range bs {
		b.calls.Store(0)
	}
	for range 100 {
		if err := ch.check("", 5*time.Second); err != nil {
			t.Fatal(err)
		}
	}
	if n := bs[2].calls.Load() + bs[3].calls.Load(); n != 0 {
		t.Fatalf("UNAVAILABLE instances got %d calls out of panic mode", n)
	}
	if c := m.Counts(); c.PanicEnters != 1 || c.Panicking != 0 {
		t.Fatalf("%+v", c)
	}
}
