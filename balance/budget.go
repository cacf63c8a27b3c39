package balance

import (
	"sync"
	"time"
)

// budget bounds retries to a share of the calls over a sliding window,
// plus a floor per second (Finagle's RetryBudget): when a whole service
// fails, retries add at most that share of load instead of multiplying
// it by 1+MaxRetries.
type budget struct {
	mu       sync.Mutex
	pct      int64
	floor    int64 // retries always allowed per window: MinPerSecond × window
	buckets  []bucket
	interval time.Duration
	// start is the origin of the slots: elapsed time on the monotonic
	// clock is one clock read (time.Now is two), and every call reads it.
	start time.Time
}

type bucket struct {
	slot           int64
	calls, retries int64
}

func newBudget(p Policy) *budget {
	n := int(p.RetryBudgetWindow / time.Second)
	return &budget{
		pct:      int64(p.RetryBudgetPercent),
		floor:    int64(p.RetryBudgetMinPerSecond) * int64(n),
		buckets:  make([]bucket, n),
		interval: time.Second,
		start:    time.Now(),
	}
}

// slot is the number of the interval now is in.
func (b *budget) slot() int64 { return int64(time.Since(b.start) / b.interval) }

func (b *budget) bucketLocked(slot int64) *bucket {
	bk := &b.buckets[slot%int64(len(b.buckets))]
	if bk.slot != slot {
		*bk = bucket{slot: slot}
	}
	return bk
}

func (b *budget) sumsLocked(slot int64) (calls, retries int64) {
	for _, bk := range b.buckets {
		if slot-bk.slot < int64(len(b.buckets)) {
			calls += bk.calls
			retries += bk.retries
		}
	}
	return calls, retries
}

// call counts one call (its first attempt).
func (b *budget) call() {
	slot := b.slot()
	b.mu.Lock()
	b.bucketLocked(slot).calls++
	b.mu.Unlock()
}

// tryRetry spends one retry if the budget allows it.
func (b *budget) tryRetry() bool {
	slot := b.slot()
	b.mu.Lock()
	defer b.mu.Unlock()
	calls, retries := b.sumsLocked(slot)
	if retries*100 >= calls*b.pct+b.floor*100 {
		return false
	}
	b.bucketLocked(slot).retries++
	return true
}
