package health

import (
	"testing"

	"pgregory.net/rapid"

	registryv1 "github.com/regcluster/registry/proto/registry/v1"
)

var allStates = []registryv1.HealthState{unknown, healthy, degraded, unavailable}

// drawThresholds draws small counts (so short scripts reach every state),
// or the defaults.
func drawThresholds(t *rapid.T) Thresholds {
	if rapid.Bool().Draw(t, "defaults") {
		return DefaultThresholds()
	}
	c := rapid.IntRange(1, 6)
	th := DefaultThresholds()
	th.FailuresToDegraded = c.Draw(t, "N")
	th.FailuresToUnavailable = c.Draw(t, "M")
	th.SuccessesToHealthy = c.Draw(t, "K")
	th.SuccessesToDegraded = c.Draw(t, "L")
	return th
}

// drawScript draws a script of results for res: any outcome, unset included.
func drawScript(t *rapid.T) string {
	return string(rapid.SliceOfN(rapid.SampledFrom([]byte("ostuex")), 0, 200).Draw(t, "script"))
}

// run replays script on m and returns the transitions.
func run(m *Machine, script string, offset int) []Transition {
	var trs []Transition
	for i := range len(script) {
		if tr, ok := m.Observe(res(script[i], offset+i)); ok {
			trs = append(trs, tr)
		}
	}
	return trs
}

// adjacent lists every transition the machine may make.
var adjacent = map[[2]registryv1.HealthState]bool{
	{unknown, healthy}:      true,
	{unknown, degraded}:     true,
	{unknown, unavailable}:  true, // never seen healthy: not adjacent, but never routable
	{healthy, degraded}:     true,
	{degraded, healthy}:     true,
	{degraded, unavailable}: true,
	{unavailable, degraded}: true,
}

// Properties (a) and (c): whatever the thresholds, starting state and
// results, transitions are only between adjacent states (or UNKNOWN to
// UNAVAILABLE for an instance never seen healthy), so never
// UNAVAILABLE -> HEALTHY, never back to UNKNOWN; each one leaves the state
// the machine was in, and restarts both runs.
func TestPropertyOnlyAdjacentTransitions(t *testing.T) {
	rapid.Check(t, func(t *rapid.T) {
		m := NewMachine(drawThresholds(t), rapid.SampledFrom(allStates).Draw(t, "from"), t0)
		script := drawScript(t)
		for i := range len(script) {
			prev := m.State()
			tr, ok := m.Observe(res(script[i], i))
			if !ok {
				if m.State() != prev {
					t.Fatalf("result %d: state %v -> %v without a transition", i, prev, m.State())
				}
				continue
			}
			if tr.From == unavailable && tr.To == healthy {
				t.Fatalf("result %d: UNAVAILABLE -> HEALTHY in one transition", i)
			}
			if !adjacent[[2]registryv1.HealthState{tr.From, tr.To}] {
				t.Fatalf("result %d: transition %v is not between adjacent states", i, tr)
			}
			if tr.From != prev || tr.To != m.State() {
				t.Fatalf("result %d: transition %v, but the machine went %v -> %v", i, tr, prev, m.State())
			}
			if tr.Reason == "" {
				t.Fatalf("result %d: transition %v without a reason", i, tr)
			}
			if f, s := m.Counters(); f != 0 || s != 0 {
				t.Fatalf("result %d: counters (%d, %d) after a transition", i, f, s)
			}
		}
	})
}

// Property (b): with the defaults, once HEALTHY, a sequence of OKs and
// failures with no run of N=3 consecutive failures never leaves HEALTHY.
func TestPropertyHealthyHoldsWithoutNFailures(t *testing.T) {
	rapid.Check(t, func(t *rapid.T) {
		th := DefaultThresholds()
		m := NewMachine(th, rapid.SampledFrom(allStates).Draw(t, "from"), t0)
		n := rapid.IntRange(0, 300).Draw(t, "n")
		pick := rapid.SampledFrom([]byte("oteu"))
		wasHealthy, run := false, 0
		for i := range n {
			c := byte('o')
			if run < th.FailuresToDegraded-1 {
				c = pick.Draw(t, "result")
			}
			if c == 'o' {
				run = 0
			} else {
				run++
			}
			m.Observe(res(c, i))
			if wasHealthy && m.State() != healthy {
				t.Fatalf("result %d (%c): left HEALTHY for %v (%s) with no run of %d failures",
					i, c, m.State(), m.Reason(), th.FailuresToDegraded)
			}
			wasHealthy = m.State() == healthy
		}
	})
}

// Property (d): replaying the same results gives the same transitions and
// the same machine, and a copy of a machine continues exactly as the
// original does.
func TestPropertyDeterministic(t *testing.T) {
	rapid.Check(t, func(t *rapid.T) {
		th := drawThresholds(t)
		from := rapid.SampledFrom(allStates).Draw(t, "from")
		script := drawScript(t)
		split := rapid.IntRange(0, len(script)).Draw(t, "split")

		a := NewMachine(th, from, t0)
		b := NewMachine(th, from, t0)
		ta, tb := run(&a, script, 0), run(&b, script, 0)
		if len(ta) != len(tb) {
			t.Fatalf("replay gave %d transitions, then %d", len(ta), len(tb))
		}
		for i := range ta {
			if ta[i] != tb[i] {
				t.Fatalf("transition %d: %v, then %v", i, ta[i], tb[i])
			}
		}
		if a != b {
			t.Fatalf("machines differ after the same results:\n%+v\n%+v", a, b)
		}

		c := NewMachine(th, from, t0)
		run(&c, script[:split], 0)
		d := c // a copy, continued separately
		tc, td := run(&c, script[split:], split), run(&d, script[split:], split)
		if len(tc) != len(td) || c != d || c != a {
			t.Fatalf("a copy at %d diverged: %v vs %v", split, tc, td)
		}
	})
}

// Property (e): an instance never seen healthy (UNKNOWN) is not routable
// until it answers: whatever the thresholds, a run of failures from UNKNOWN
// ends in UNKNOWN or UNAVAILABLE, never DEGRADED or HEALTHY, and the first
// answer then decides (OK: HEALTHY, slow: DEGRADED).
func TestPropertyNeverHealthyNeverDegradesOnFailures(t *testing.T) {
	rapid.Check(t, func(t *rapid.T) {
		th := drawThresholds(t)
		m := NewMachine(th, unknown, t0)
		failures := string(rapid.SliceOfN(rapid.SampledFrom([]byte("teux")), 0, 50).Draw(t, "failures"))
		for i := range len(failures) {
			m.Observe(res(failures[i], i))
			if s := m.State(); s != unknown && s != unavailable {
				t.Fatalf("result %d (%c) of only failures: %v (%s)", i, failures[i], s, m.Reason())
			}
		}
		if want := min(len(failures), th.FailuresToDegraded) == th.FailuresToDegraded; want != (m.State() == unavailable) {
			t.Fatalf("after %d failures (N=%d): %v", len(failures), th.FailuresToDegraded, m.State())
		}
		if m.State() == unknown {
			answer := rapid.SampledFrom([]byte("os")).Draw(t, "answer")
			m.Observe(res(answer, len(failures)))
			want := healthy
			if answer == 's' {
				want = degraded
			}
			if m.State() != want {
				t.Fatalf("first answer %c after %d failures: %v, want %v", answer, len(failures), m.State(), want)
			}
		}
	})
}
