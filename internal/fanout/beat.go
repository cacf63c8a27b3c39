package fanout

import (
	"sync"
	"time"
)

// Progress is paced. Every transaction publishes a tick (Subscribe's
// catch-up waits follow it), but subscribers whose service the
// transaction did not touch send progress from the beat: the latest tick,
// republished at most once per Config.ProgressGap. Were they to send
// progress on every tick, each transaction anywhere would cost one
// message to every subscriber of every service (a thousand subscribers
// over a hundred services, fifty changes a second: fifty thousand
// messages a second, where the changes themselves need five hundred).
// The beat keeps the contract: a subscriber of a quiet service still
// hears progress at least once per ProgressGap while the registry moves,
// and once per watcher heartbeat (ProgressInterval) while it is idle.

// beat is a tick as subscribers see it, and a channel closed when the
// next beat replaces it.
type beat struct {
	t       *tick
	changed chan struct{}
}

// beater publishes beats. The zero value is unusable: see newBeater.
type beater struct {
	gap time.Duration
	cur func() *tick // the hub's latest tick

	mu     sync.Mutex
	b      *beat
	last   time.Time   // when the last beat was published
	timer  *time.Timer // a beat is due at its firing
	closed bool
	wg     sync.WaitGroup // a firing timer's function
}

func newBeater(gap time.Duration, cur func() *tick) *beater {
	return &beater{gap: gap, cur: cur, b: &beat{t: cur(), changed: make(chan struct{})}}
}

// load is the current beat.
func (bt *beater) load() *beat {
	bt.mu.Lock()
	defer bt.mu.Unlock()
	return bt.b
}

// offer asks for a beat of the latest tick: now if the last one is at
// least gap old, else when it will be (one timer, whatever the number of
// ticks in between: the beat then carries the latest).
func (bt *beater) offer() {
	bt.mu.Lock()
	defer bt.mu.Unlock()
	if bt.closed || bt.timer != nil {
		return
	}
	wait := bt.gap - time.Since(bt.last)
	if wait <= 0 {
		bt.publishLocked()
		return
	}
	bt.wg.Add(1)
	bt.timer = time.AfterFunc(wait, func() {
		defer bt.wg.Done()
		bt.mu.Lock()
		defer bt.mu.Unlock()
		bt.timer = nil
		if !bt.closed {
			bt.publishLocked()
		}
	})
}

func (bt *beater) publishLocked() {
	bt.last = time.Now()
	old := bt.b
	bt.b = &beat{t: bt.cur(), changed: make(chan struct{})}
	close(old.changed)
}

// close publishes a last beat (waking every subscriber waiting on one)
// and stops the timer, waiting for a firing one.
func (bt *beater) close() {
	bt.mu.Lock()
	bt.closed = true
	if bt.timer != nil && bt.timer.Stop() {
		bt.wg.Done() // its function will not run
	}
	bt.timer = nil
	bt.publishLocked()
	bt.mu.Unlock()
	bt.wg.Wait()
}
