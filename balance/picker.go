package balance

import (
	"fmt"
	"math/bits"
	rand "math/rand/v2"
	"sync/atomic"

	"google.golang.org/grpc/balancer"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
)

func unavailablef(format string, args ...any) error {
	return status.Error(codes.Unavailable, fmt.Sprintf(format, args...))
}

// cand is one endpoint a picker may choose, at its weight of the moment
// the picker was built (slow start included).
type cand struct {
	ep    *endpoint
	pk    balancer.Picker // the pickfirst child's READY picker
	w     uint64
	id    string
	zone  string
	picks *atomic.Int64
	// done is the Done of a pick of ep by this picker outside a probe and
	// outside the retry interceptor, made once when the picker is built
	// so that such a pick allocates nothing.
	done func(balancer.DoneInfo)
}

// doneFunc is what a call's end does to ep: one fewer in flight, and the
// outcome to outlier detection.
func doneFunc(ep *endpoint, sh *shared) func(balancer.DoneInfo) {
	return func(di balancer.DoneInfo) {
		ep.inflight.Add(-1)
		ep.owner.done(ep, sh, di, false)
	}
}

// set is a group of candidates with what weighted picking needs.
type set struct {
	cands []cand
	cum   []uint64 // cumulative weights, for weighted sampling

	// WRR: the picks take turns by an atomic cursor, over seq (smooth
	// WRR's order, precomputed) when it is short enough to keep, else
	// over a golden-ratio sequence of points of the cumulative weights.
	cursor atomic.Uint64
	seq    []int32

	// P2C: Vose's alias table over the weights, so a weighted draw is
	// O(1): column i is kept if the draw's second part is below prob[i]
	// (out of the total weight), else it gives alias[i].
	prob  []uint64
	alias []int32
}

// Bounds of a precomputed smooth WRR order: its length (the sum of the
// weights over their gcd) and the work to build it (length × candidates),
// so that building a picker stays well under a millisecond.
const (
	maxSeq     = 1 << 13
	maxSeqWork = 1 << 18
)

func newSet(cands []cand, wrr bool) *set {
	s := &set{cands: cands, cum: make([]uint64, len(cands))}
	var t uint64
	for i, c := range cands {
		t += c.w
		s.cum[i] = t
	}
	if wrr {
		s.seq = smoothWRR(cands)
	} else {
		s.prob, s.alias = aliasTable(cands, t)
	}
	return s
}

// aliasTable is Vose's alias method in integers: each of the n columns
// holds total/n of weight, its own candidate's share (prob, out of total)
// and the rest given to one candidate with more than total/n (alias).
// Column i is then drawn with probability 1/n, and candidate j comes out
// with probability exactly w_j/total.
func aliasTable(cands []cand, total uint64) ([]uint64, []int32) {
	n := len(cands)
	prob, alias := make([]uint64, n), make([]int32, n)
	scaled := make([]uint64, n) // w × n, against total
	var small, large []int32
	for i, c := range cands {
		scaled[i] = c.w * uint64(n)
		if scaled[i] < total {
			small = append(small, int32(i))
		} else {
			large = append(large, int32(i))
		}
	}
	for len(small) > 0 && len(large) > 0 {
		s, l := small[len(small)-1], large[len(large)-1]
		small, large = small[:len(small)-1], large[:len(large)-1]
		prob[s], alias[s] = scaled[s], l
		scaled[l] -= total - scaled[s]
		if scaled[l] < total {
			small = append(small, l)
		} else {
			large = append(large, l)
		}
	}
	for _, i := range append(small, large...) { // what is left fills its column
		prob[i], alias[i] = total, i
	}
	return prob, alias
}

// draw is one weighted draw through the alias table, from one random
// 64-bit value: its high part chooses the column, the rest the side.
func (s *set) draw(total uint64) int {
	col, rest := bits.Mul64(rand.Uint64(), uint64(len(s.prob)))
	if u, _ := bits.Mul64(rest, total); u < s.prob[col] {
		return int(col)
	}
	return int(s.alias[col])
}

// smoothWRR is nginx's smooth weighted round robin run over one cycle
// (the sum of the weights over their gcd): every candidate gains its
// weight, the highest is chosen and loses the total. Over the cycle each
// candidate gets exactly its weight's share, spread out. nil if the
// cycle is too long to keep (see maxSeq).
func smoothWRR(cands []cand) []int32 {
	if len(cands) == 0 {
		return nil
	}
	g := uint64(0)
	for _, c := range cands {
		g = gcd(g, c.w)
	}
	var total uint64
	for _, c := range cands {
		total += c.w / g
		if total > maxSeq {
			return nil
		}
	}
	if total*uint64(len(cands)) > maxSeqWork {
		return nil
	}
	cur := make([]int64, len(cands))
	seq := make([]int32, total)
	for k := range seq {
		best := 0
		for i, c := range cands {
			cur[i] += int64(c.w / g)
			if cur[i] > cur[best] {
				best = i
			}
		}
		cur[best] -= int64(total)
		seq[k] = int32(best)
	}
	return seq
}

func gcd(a, b uint64) uint64 {
	for b != 0 {
		a, b = b, a%b
	}
	return a
}

// picker is an immutable snapshot. The P2C path takes no lock: in-flight
// counts are atomics, incremented on pick and decremented in Done.
type picker struct {
	sh       *shared
	all      *set
	halfOpen []cand // ejected endpoints whose ejection is over: one call at a time
	err      error  // set when nothing can be called
	final    bool   // err is a fact of the registry: do not retry it

	// Zone-aware routing: with probability pLocal a call goes to local,
	// otherwise to remote; nil local means no zone routing.
	local, remote *set
	pLocal        float64
}

// weights are the weights of the candidates (ejected ones, even due a
// half-open call, are not candidates).
func (p *picker) weights() map[string]uint64 {
	w := make(map[string]uint64, len(p.all.cands))
	for _, c := range p.all.cands {
		w[c.id] = c.w
	}
	return w
}

func (p *picker) with(err error, final bool) *picker {
	p.err, p.final = err, final
	return p
}

func (p *picker) Pick(info balancer.PickInfo) (balancer.PickResult, error) {
	c := callFrom(info.Ctx)
	if c != nil {
		c.bind(p.sh)
	}
	if p.err != nil {
		if p.err != balancer.ErrNoSubConnAvailable {
			p.sh.metrics.noInstanceErrors.Add(1)
			if c != nil && p.final {
				c.markFinal()
			}
		}
		return balancer.PickResult{}, p.err
	}
	for i := range p.halfOpen {
		h := &p.halfOpen[i]
		if c.tried(h.ep.key) || !h.ep.probing.CompareAndSwap(false, true) {
			continue
		}
		res, err := p.use(h, info, c, true)
		if err == nil {
			p.sh.metrics.halfOpenProbes.Add(1)
			return res, nil
		}
		h.ep.probing.Store(false)
	}
	s := p.all
	if p.local != nil {
		if p.pLocal >= 1 || rand.Float64() < p.pLocal {
			s = p.local
		} else {
			s = p.remote
		}
	}
	chosen := p.choose(s, c)
	if chosen == nil && s != p.all { // the zone's instances were all tried
		chosen = p.choose(p.all, c)
	}
	if chosen == nil {
		if c != nil {
			c.markFinal()
		}
		return balancer.PickResult{}, unavailablef("%s: every instance that can be called was already tried for this call", p.sh.service)
	}
	return p.use(chosen, info, c, false)
}

func (p *picker) choose(s *set, c *call) *cand {
	if p.sh.policy.Picker == PickerWRR {
		return s.wrr(c)
	}
	return s.p2c(c)
}

// p2c draws a candidate with probability proportional to weight, then a
// second one the same way among the others, and keeps the second only if
// it has fewer in-flight calls per unit of weight (seed 004's score,
// active/weight). On a tie the first stays: it was itself a weighted
// random draw, so an idle channel (every score 0) splits calls exactly by
// weight, and under load every pick compares two distinct instances,
// which moves calls away from one that answers slowly.
func (s *set) p2c(c *call) *cand {
	cands, cum := s.cands, s.cum
	if c.anyTried() {
		cands, cum = s.untried(c)
	}
	n := len(cands)
	if n == 0 {
		return nil
	}
	if n == 1 {
		return &cands[0]
	}
	total := cum[n-1]
	var ia, ib int
	if s.prob != nil && len(cands) == len(s.cands) { // nothing tried: O(1) draws
		ia, ib = s.draw(total), -1
		// The second among the others: redraw a few times (exact: the
		// draws that hit ia are thrown away), then, if one candidate
		// holds most of the weight, through the cumulative weights.
		for range 4 {
			if ib = s.draw(total); ib != ia {
				break
			}
		}
		if ib == ia {
			ib = drawOther(cum, ia, rand.Uint64N(total-cands[ia].w))
		}
	} else {
		ia = drawIndex(cum, rand.Uint64N(total))
		ib = drawOther(cum, ia, rand.Uint64N(total-cands[ia].w))
	}
	a, b := &cands[ia], &cands[ib]
	// b.inflight/b.w < a.inflight/a.w without division.
	if uint64(b.ep.inflight.Load())*a.w < uint64(a.ep.inflight.Load())*b.w {
		return b
	}
	return a
}

// drawIndex maps r in [0, total weight) to the candidate whose range of
// the cumulative weights holds it (a binary search: sort.Search's
// without the call through a func).
func drawIndex(cum []uint64, r uint64) int {
	lo, hi := 0, len(cum)
	for lo < hi {
		m := int(uint(lo+hi) >> 1)
		if cum[m] > r {
			hi = m
		} else {
			lo = m + 1
		}
	}
	return lo
}

// drawOther maps r in [0, total weight − weight of ia) to a candidate
// other than ia, each with probability proportional to its weight: r
// skips ia's range.
func drawOther(cum []uint64, ia int, r uint64) int {
	lo := uint64(0)
	if ia > 0 {
		lo = cum[ia-1]
	}
	if r >= lo {
		r += cum[ia] - lo
	}
	return drawIndex(cum, r)
}

func (s *set) untried(c *call) ([]cand, []uint64) {
	var out []cand
	var cum []uint64
	var t uint64
	for _, x := range s.cands {
		if !c.tried(x.ep.key) {
			t += x.w
			out, cum = append(out, x), append(cum, t)
		}
	}
	return out, cum
}

// wrr takes the next turn of the set: O(1) and lock-free over the
// precomputed smooth WRR order (nginx's: over any cycle of it each
// candidate gets exactly its weight's share, spread out), else O(log n)
// over the golden-ratio sequence, whose shares are within a few per
// thousand of the weights' over any few thousand picks. A retry skips
// the instances already tried by taking its turn among the others.
func (s *set) wrr(c *call) *cand {
	k := s.cursor.Add(1) - 1
	cands, cum := s.cands, s.cum
	if c.anyTried() {
		cands, cum = s.untried(c)
	} else if s.seq != nil {
		return &s.cands[s.seq[k%uint64(len(s.seq))]]
	}
	n := len(cands)
	if n == 0 {
		return nil
	}
	// k/φ mod 1 spreads the turns evenly over [0, 1): scaled to the
	// total weight, a turn lands in a candidate's range by its weight.
	r, _ := bits.Mul64(k*0x9e3779b97f4a7c15, cum[n-1])
	return &cands[drawIndex(cum, r)]
}

// use picks through the chosen child and wires the passive signals of
// the call into Done: in-flight count, outlier detection, the retry
// interceptor's record of attempts.
func (p *picker) use(x *cand, info balancer.PickInfo, c *call, probe bool) (balancer.PickResult, error) {
	res, err := x.pk.Pick(info)
	if err != nil {
		return res, err
	}
	ep := x.ep
	ep.inflight.Add(1)
	x.picks.Add(1)
	next := res.Done
	if c == nil && next == nil && !probe && x.done != nil {
		res.Done = x.done // the common case: nothing to allocate
		return res, nil
	}
	if c != nil {
		res.Done = c.record(x, p.sh, probe, next)
		return res, nil
	}
	sh := p.sh
	res.Done = func(di balancer.DoneInfo) {
		ep.inflight.Add(-1)
		ep.owner.done(ep, sh, di, probe)
		if next != nil {
			next(di)
		}
	}
	return res, nil
}
