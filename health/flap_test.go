package health

import (
	"math"
	"math/rand/v2"
	"testing"
	"time"

	registryv1 "github.com/regcluster/registry/proto/registry/v1"
)

// The flapping test: an instance whose probes fail at random, 20% of the
// time, independently, with the default thresholds, over 10,000 probes.
//
// How often it should reach UNAVAILABLE is computed exactly below, from a
// Markov chain over (state, failure run, success run), which is all the
// machine's decisions depend on. By hand, with p = 0.2 and q = 0.8: once
// DEGRADED (both runs at 0), let a_f be the probability of reaching
// UNAVAILABLE (5 failures in a row) before HEALTHY (3 OKs in a row) with a
// failure run of f, and b_s with a success run of s. Then
//
//	b_2 = p·a_1, b_1 = p·a_1 + q·b_2 = p(1+q)·a_1 = 0.36·a_1
//	a_1 = p⁴ + q·b_1·(1+p+p²+p³) = 0.0016 + 0.359424·a_1, so a_1 ≈ 0.0024977
//	a_0 = p·a_1 + q·b_1 ≈ 0.00122
//
// so about 1 DEGRADED spell in 820 ends UNAVAILABLE. A HEALTHY spell lasts
// (1-p³)/((1-p)p³) = 155 probes on average (the wait for 3 failures in a
// row), a DEGRADED one about 5, so 10,000 probes hold about 62 DEGRADED
// spells and E[UNAVAILABLE entries] ≈ 0.077 (the chain's exact figure):
// P(never UNAVAILABLE) ≈ 92.6%, not 100%. "Never" is true of this seed,
// and the test checks it, but it is a fact about the seed, not the
// machine: 7.4% of seeds reach UNAVAILABLE at least once. The sound
// assertion, which holds for all but a 1e-9 fraction of seeds, is that the
// count is not in a far tail of its exact distribution: it is at most k
// where P(count > k) < 1e-9, which is k = 5. The same check is applied to
// every kind of transition.
const (
	flapProbes   = 10_000
	flapFailRate = 0.2
	flapTail     = 1e-9
)

// flapState is the model of the machine under the defaults that the chain
// runs on: the state and the two runs.
type flapState struct {
	state registryv1.HealthState
	f, s  int
}

// flapStep is the model's rule, written independently of Machine (the test
// checks the two agree on the seeded sequence): the next state after a
// failure or an OK, and the transition made, if any.
func flapStep(x flapState, fail bool) (flapState, [2]registryv1.HealthState, bool) {
	th := DefaultThresholds()
	move := func(to registryv1.HealthState) (flapState, [2]registryv1.HealthState, bool) {
		return flapState{state: to}, [2]registryv1.HealthState{x.state, to}, true
	}
	if fail {
		x.f, x.s = x.f+1, 0
	} else {
		x.f, x.s = 0, x.s+1
	}
	switch x.state {
	case unknown:
		x.s = 0 // irrelevant in UNKNOWN
		if !fail {
			return move(healthy)
		}
		if x.f >= th.FailuresToDegraded {
			return move(unavailable)
		}
	case healthy:
		x.s = 0 // irrelevant in HEALTHY: keep the chain small
		if x.f >= th.FailuresToDegraded {
			return move(degraded)
		}
	case degraded:
		if x.f >= th.FailuresToUnavailable {
			return move(unavailable)
		}
		if x.s >= th.SuccessesToHealthy {
			return move(healthy)
		}
	case unavailable:
		x.f = 0 // irrelevant in UNAVAILABLE
		if x.s >= th.SuccessesToDegraded {
			return move(degraded)
		}
	}
	return x, [2]registryv1.HealthState{}, false
}

// flapChain is the chain's transition table over its reachable states,
// index 0 being UNKNOWN with empty runs.
type flapChain struct {
	states []flapState
	next   [][2]int                       // [i][fail] -> j
	edge   [][2][2]registryv1.HealthState // [i][fail] -> transition made
	moved  [][2]bool                      // [i][fail] -> a transition was made
}

func newFlapChain() *flapChain {
	c := &flapChain{}
	index := map[flapState]int{}
	var add func(x flapState) int
	add = func(x flapState) int {
		if i, ok := index[x]; ok {
			return i
		}
		i := len(c.states)
		index[x] = i
		c.states = append(c.states, x)
		c.next = append(c.next, [2]int{})
		c.edge = append(c.edge, [2][2]registryv1.HealthState{})
		c.moved = append(c.moved, [2]bool{})
		for b, fail := range []bool{false, true} {
			y, e, moved := flapStep(x, fail)
			j := add(y)
			c.next[i][b], c.edge[i][b], c.moved[i][b] = j, e, moved
		}
		return i
	}
	add(flapState{state: unknown})
	return c
}

// countDistribution returns the exact distribution of the number of
// transitions e made in n probes from UNKNOWN (the last entry lumps counts
// at or above limit), and its expectation.
func (c *flapChain) countDistribution(e [2]registryv1.HealthState, n, limit int) ([]float64, float64) {
	w := limit + 1
	cur := make([]float64, len(c.states)*w)
	nxt := make([]float64, len(cur))
	cur[0] = 1
	mean := 0.0
	prob := [2]float64{1 - flapFailRate, flapFailRate}
	for range n {
		clear(nxt)
		for i := range c.states {
			for k := range w {
				pk := cur[i*w+k]
				if pk == 0 {
					continue
				}
				for b := range 2 {
					q := pk * prob[b]
					k2 := k
					if c.moved[i][b] && c.edge[i][b] == e {
						mean += q
						k2 = min(k+1, limit)
					}
					nxt[c.next[i][b]*w+k2] += q
				}
			}
		}
		cur, nxt = nxt, cur
	}
	dist := make([]float64, w)
	for i := range c.states {
		for k := range w {
			dist[k] += cur[i*w+k]
		}
	}
	return dist, mean
}

// meanOf returns the mean of a distribution over 0, 1, 2...
func meanOf(dist []float64) float64 {
	m := 0.0
	for k, p := range dist {
		m += float64(k) * p
	}
	return m
}

// tails returns the smallest lo and largest hi such that P(X < lo) and
// P(X > hi) are both below eps.
func tails(dist []float64, eps float64) (lo, hi int) {
	below := 0.0
	for lo = 0; lo < len(dist) && below+dist[lo] < eps; lo++ {
		below += dist[lo]
	}
	above := 0.0
	for hi = len(dist) - 1; hi > 0 && above+dist[hi] < eps; hi-- {
		above += dist[hi]
	}
	return lo, hi
}

func TestFlapping20Percent(t *testing.T) {
	rng := rand.New(rand.NewPCG(20, 10_000))
	m := NewMachine(DefaultThresholds(), unknown, t0)
	chain := newFlapChain()
	model := flapState{state: unknown}
	counts := map[[2]registryv1.HealthState]int{}
	failures := 0
	at := t0
	for i := range flapProbes {
		at = at.Add(time.Second)
		r := Result{Outcome: OK, Latency: 5 * time.Millisecond, At: at}
		fail := rng.Float64() < flapFailRate
		if fail {
			failures++
			switch rng.IntN(3) {
			case 0:
				r = Result{Outcome: Timeout, Latency: 500 * time.Millisecond, Detail: "timeout after 500ms", At: at}
			case 1:
				r = Result{Outcome: Error, Latency: time.Millisecond, Detail: "connection refused", At: at}
			default:
				r = Result{Outcome: Unhealthy, Latency: 2 * time.Millisecond, Detail: "HTTP 503", At: at}
			}
		}
		tr, ok := m.Observe(r)
		if ok {
			counts[[2]registryv1.HealthState{tr.From, tr.To}]++
		}
		var moved bool
		model, _, moved = flapStep(model, fail)
		if moved != ok || model.state != m.State() {
			t.Fatalf("probe %d: the machine (%v, moved %v) and the chain's model (%v, moved %v) disagree", i, m.State(), ok, model.state, moved)
		}
	}
	t.Logf("%d probes, %d failures (%.2f%%), %d chain states", flapProbes, failures, 100*float64(failures)/flapProbes, len(chain.states))

	dists := map[[2]registryv1.HealthState][]float64{}
	for _, c := range []struct {
		e     [2]registryv1.HealthState
		limit int
	}{
		{[2]registryv1.HealthState{unknown, healthy}, 2},
		{[2]registryv1.HealthState{unknown, degraded}, 2},
		{[2]registryv1.HealthState{unknown, unavailable}, 2},
		{[2]registryv1.HealthState{healthy, degraded}, 140},
		{[2]registryv1.HealthState{degraded, healthy}, 140},
		{[2]registryv1.HealthState{degraded, unavailable}, 20},
		{[2]registryv1.HealthState{unavailable, degraded}, 20},
	} {
		dist, mean := chain.countDistribution(c.e, flapProbes, c.limit)
		dists[c.e] = dist
		lo, hi := tails(dist, flapTail)
		got := counts[c.e]
		t.Logf("%-11s -> %-11s %4d   expected %8.3f, P(0) = %.4f, allowed [%d, %d] (each tail beyond < 1e-9)",
			stateName(c.e[0]), stateName(c.e[1]), got, mean, dist[0], lo, hi)
		if hi == c.limit {
			t.Fatalf("limit %d too low for %v", c.limit, c.e)
		}
		if got < lo || got > hi {
			t.Errorf("%v -> %v happened %d times: outside [%d, %d], where each tail has probability < %g",
				stateName(c.e[0]), stateName(c.e[1]), got, lo, hi, flapTail)
		}
	}

	// The figures of the comment at the top.
	dist := dists[[2]registryv1.HealthState{degraded, unavailable}]
	if mean := meanOf(dist); math.Abs(mean-0.077) > 0.002 {
		t.Errorf("E[UNAVAILABLE entries] = %.4f, the comment says 0.077", mean)
	}
	if _, hi := tails(dist, flapTail); hi != 5 {
		t.Errorf("UNAVAILABLE entries: 1e-9 upper tail above %d, the comment says 5", hi)
	}
	t.Logf("P(UNAVAILABLE reached at least once in %d probes) = %.4f", flapProbes, 1-dist[0])
	// True of this seed only (92.6% of seeds): see the comment at the top.
	if n := counts[[2]registryv1.HealthState{degraded, unavailable}]; n != 0 {
		t.Errorf("seed (20, 10000) reached UNAVAILABLE %d times; it did not when this test was written", n)
	}
}
