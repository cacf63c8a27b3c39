package main

import (
	"context"
	"fmt"
	"strconv"
	"strings"
	"time"
)

// probeTargetsArg, as the first argument, makes regbench (or its test
// binary) a process of the probe scenario's TCP targets (see
// probe_targets_linux.go), answering one command per line on stdin (each
// answer starts with the command's word, or is "err MESSAGE"):
//
//	every E B → every: from now on, listener i of this child (the pool's
//	           listener B+i) accepts and is timed when (B+i)%E == 0; the
//	           others are deferred (see probe_targets_linux.go)
//	add K    → add ADDR...: K more listeners, on 127.77.x.y, ports 20000-32767
//	start N  → start: a window over listeners [0, N) begins
//	stop     → stop ACCEPTS GAP...: the window ends; the connections accepted
//	           in it, and each listener's longest gap between two probes in
//	           milliseconds (the window's ends count as probes; -1: killed;
//	           -2: deferred, not timed)
//	kill I   → kill UNIXNANO: listener I is closed (its address refuses)
//
// It closes everything and exits when stdin closes.
const probeTargetsArg = "__regbench-probe-targets"

// perTargetChild is the most listeners one target process holds: each is
// a file descriptor, and the hard limit on them here is 20,000.
const perTargetChild = 16000

// targetPool is the parent's handle on the target processes: listener i
// is listener i%perTargetChild of child i/perTargetChild.
type targetPool struct {
	ctx    context.Context
	every  int // listener i is timed when i%every == 0
	kids   []*childProc
	addrs  []string
	killed map[int]bool
}

func newTargetPool(ctx context.Context, every int) *targetPool {
	return &targetPool{ctx: ctx, every: every, killed: map[int]bool{}}
}

// grow makes sure there are at least n listeners.
func (p *targetPool) grow(n int) error {
	for len(p.addrs) < n {
		k := len(p.addrs) / perTargetChild
		if k == len(p.kids) {
			c, err := startChild(p.ctx, fmt.Sprintf("target process %d", k), probeTargetsArg)
			if err != nil {
				return err
			}
			p.kids = append(p.kids, c)
			if _, err := c.ask(fmt.Sprintf("every %d %d", p.every, k*perTargetChild)); err != nil {
				return err
			}
		}
		want := min(n-len(p.addrs), (k+1)*perTargetChild-len(p.addrs))
		f, err := p.kids[k].ask("add " + strconv.Itoa(want))
		if err != nil {
			return err
		}
		if len(f) != want {
			return fmt.Errorf("target process %d: asked for %d listeners, got %d", k, want, len(f))
		}
		p.addrs = append(p.addrs, f...)
	}
	return nil
}

// start begins a window over listeners [0, n).
func (p *targetPool) start(n int) error {
	for k, c := range p.kids {
		if _, err := c.ask("start " + strconv.Itoa(max(0, min(perTargetChild, n-k*perTargetChild)))); err != nil {
			return err
		}
	}
	return nil
}

// stop ends the window: the connections accepted in it, and each measured
// listener's longest gap between probes (-1ms: killed; -2ms: not timed).
func (p *targetPool) stop() (accepts int64, gaps []time.Duration, err error) {
	for _, c := range p.kids {
		f, err := c.ask("stop")
		if err != nil {
			return 0, nil, err
		}
		if len(f) == 0 {
			return 0, nil, fmt.Errorf("%s: empty stop line", c.what)
		}
		n, err := strconv.ParseInt(f[0], 10, 64)
		if err != nil {
			return 0, nil, fmt.Errorf("%s: %w", c.what, err)
		}
		accepts += n
		for _, s := range f[1:] {
			ms, err := strconv.ParseInt(s, 10, 64)
			if err != nil {
				return 0, nil, fmt.Errorf("%s: %w", c.what, err)
			}
			gaps = append(gaps, time.Duration(ms)*time.Millisecond)
		}
	}
	return accepts, gaps, nil
}

// kill closes listener i and returns when.
func (p *targetPool) kill(i int) (time.Time, error) {
	f, err := p.kids[i/perTargetChild].ask("kill " + strconv.Itoa(i%perTargetChild))
	if err != nil {
		return time.Time{}, err
	}
	p.killed[i] = true
	ns, err := strconv.ParseInt(strings.Join(f, ""), 10, 64)
	return time.Unix(0, ns), err
}

// cpu is the target processes' CPU time so far.
func (p *targetPool) cpu() time.Duration {
	var sum time.Duration
	for _, c := range p.kids {
		sum += procCPU(c.cmd.Process.Pid)
	}
	return sum
}

// close stops every target process and waits for it.
func (p *targetPool) close() {
	for _, c := range p.kids {
		_ = c.stop()
	}
}
