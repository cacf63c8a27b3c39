package peerlimit

import (
	"context"
	"slices"
	"sync"
)

// Writes in flight.
//
// The rate limits bound how many writes a key makes per second, not how
// many it has in etcd's pipeline at once, and that is what another key's
// calls wait behind: measured with regbench flood, one peer's flood with
// 64 Registers in flight made another peer's List p50 about 30 times its
// idle figure, with 8 in flight about 5 times, for nearly the same flood
// rate. So a key's writes past MaxWritesInFlight wait their turn in this
// regnode (first come, first served, for as long as their context
// allows) instead of queueing in etcd in front of everyone else's calls.
// Nothing is refused for it: a thousand instances registering at once
// from one host go through, MaxWritesInFlight at a time.

// gate is the writes of one key in flight, and those waiting, in order.
type gate struct {
	running int
	waiting []chan struct{}
}

// EnterWrite waits until key has fewer than MaxWritesInFlight writes in
// flight, and returns the function that ends this one (once; later calls
// do nothing). It returns ctx's error if ctx ends first.
func (l *Limiter) EnterWrite(ctx context.Context, key string) (done func(), err error) {
	l.mu.Lock()
	b := l.get(key)
	if b.writes.running < l.cfg.MaxWritesInFlight {
		b.writes.running++
		l.mu.Unlock()
		return l.exit(b), nil
	}
	turn := make(chan struct{})
	b.writes.waiting = append(b.writes.waiting, turn)
	l.mu.Unlock()
	select {
	case <-turn: // the write that ended handed its place over
		return l.exit(b), nil
	case <-ctx.Done():
		l.mu.Lock()
		if i := slices.Index(b.writes.waiting, turn); i >= 0 {
			b.writes.waiting = slices.Delete(b.writes.waiting, i, i+1)
			l.mu.Unlock()
			return nil, ctx.Err()
		}
		l.mu.Unlock()
		l.exit(b)() // handed over as ctx ended: pass it on
		return nil, ctx.Err()
	}
}

// exit is the end of one write of b: its place goes to the first waiting,
// if any. b stays in the map meanwhile: get never forgets a key with
// writes running or waiting.
func (l *Limiter) exit(b *bucket) func() {
	var once sync.Once
	return func() {
		once.Do(func() {
			l.mu.Lock()
			defer l.mu.Unlock()
			if len(b.writes.waiting) > 0 {
				close(b.writes.waiting[0])
				b.writes.waiting = b.writes.waiting[1:]
				return
			}
			b.writes.running--
		})
	}
}

// Waiting is how many writes of key wait for their turn now.
func (l *Limiter) Waiting(key string) int {
	l.mu.Lock()
	defer l.mu.Unlock()
	if b, ok := l.mu.peers[key]; ok {
		return len(b.writes.waiting)
	}
	return 0
}
