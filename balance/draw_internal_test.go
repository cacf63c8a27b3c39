package balance

import (
	"context"
	"testing"
)

// The second P2C draw never returns the first and covers every other
// candidate by its weight.
func TestDrawOther(t *testing.T) {
	cum := []uint64{100, 150, 350} // weights 100, 50, 200
	for ia, w := range []uint64{100, 50, 200} {
		counts := make([]uint64, 3)
		for r := uint64(0); r < 350-w; r++ {
			counts[drawOther(cum, ia, r)]++
		}
		for i, c := range counts {
			want := cum[i]
			if i > 0 {
				want -= cum[i-1]
			}
			if i == ia {
				want = 0
			}
			if c != want {
				t.Errorf("first %d: candidate %d drawn for %d values, want %d", ia, i, c, want)
			}
		}
	}
}

func candsOf(ws ...uint64) []cand {
	cs := make([]cand, len(ws))
	for i, w := range ws {
		cs[i] = cand{w: w, ep: &endpoint{key: string(rune('a' + i))}}
	}
	return cs
}

// The alias table gives every candidate exactly its weight's mass: over
// the n columns, each worth the total weight, candidate j holds w_j × n.
func TestAliasTableExact(t *testing.T) {
	for _, ws := range [][]uint64{{100, 100, 200}, {1, 1000, 7, 3}, {5}, {100, 200, 100, 200, 100, 5, 25, 50}, {1 << 31, 1, 3}} {
		s := newSet(candsOf(ws...), false)
		total := s.cum[len(s.cum)-1]
		mass := make([]uint64, len(ws))
		for i := range s.prob {
			if s.prob[i] > total {
				t.Fatalf("%v: column %d keeps %d of %d", ws, i, s.prob[i], total)
			}
			mass[i] += s.prob[i]
			mass[s.alias[i]] += total - s.prob[i]
		}
		for j, w := range ws {
			if mass[j] != w*uint64(len(ws)) {
				t.Errorf("%v: candidate %d has mass %d, want %d", ws, j, mass[j], w*uint64(len(ws)))
			}
		}
	}
}

// The precomputed WRR order is nginx's smooth WRR, step for step (the
// reference below is the loop the picker ran before under a mutex), and
// the picks follow it by turns.
func TestSmoothWRROrder(t *testing.T) {
	ws := []uint64{100, 100, 200, 500}
	s := newSet(candsOf(ws...), true)
	if len(s.seq) != 9 { // (1+1+2+5) over a gcd of 100
		t.Fatalf("cycle of %d turns, want 9", len(s.seq))
	}
	cur := make([]int64, len(ws))
	for k := range 3 * len(s.seq) {
		best, total := -1, int64(0)
		for i, w := range ws {
			cur[i] += int64(w)
			total += int64(w)
			if best < 0 || cur[i] > cur[best] {
				best = i
			}
		}
		cur[best] -= total
		if got := s.wrr(nil); got != &s.cands[best] {
			t.Fatalf("turn %d: got candidate %d, nginx's order says %d", k, got.w, ws[best])
		}
	}
}

// When the cycle is too long to keep, the golden-ratio turns still give
// each candidate its weight's share within half a point over 4,000
// picks, and a retry's turn skips the instances tried.
func TestWRRLongCycle(t *testing.T) {
	ws := []uint64{100003, 200003, 100019, 400009} // coprime: a cycle of 800,034 turns
	s := newSet(candsOf(ws...), true)
	if s.seq != nil {
		t.Fatalf("a cycle of %d turns was kept", len(s.seq))
	}
	const n = 4000
	counts := make([]int, len(ws))
	for range n {
		counts[s.wrr(nil).ep.key[0]-'a']++
	}
	total := float64(ws[0] + ws[1] + ws[2] + ws[3])
	for i, w := range ws {
		got, want := float64(counts[i])*100/n, float64(w)*100/total
		if got < want-0.5 || got > want+0.5 {
			t.Errorf("candidate %d: %.2f%% of turns, want %.2f%%", i, got, want)
		}
	}
	c := newCall(context.Background())
	c.record(&s.cands[3], nil, false, nil)
	for range 100 {
		if got := s.wrr(c); got.ep.key == "d" {
			t.Fatal("a retry's turn went to the instance already tried")
		}
	}
}
