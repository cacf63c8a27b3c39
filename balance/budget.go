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
	}
}

func (b *budget) bucketLocked(now time.Time) *bucket {
	slot := now.UnixNano() / int64(b.interval)
	bk := &b.buckets[slot%int64(len(b.buckets))]
	if bk.slot != slot {
		*bk = bucket{slot: slot}
	}
	return bk
}

func (b *budget) sumsLocked(now time.Time) (calls, retries int64) {
	slot := now.UnixNano() / int64(b.interval)
	for _, bk := range b.buckets {
		if slot-bk.slot < int64(len(b.buckets)) {
			calls += bk.calls
			retries += bk.retries
		}
	}
	return calls, retries
}

// call counts one call (its first attempt).
func (b *budget) call(now time.Time) {
	b.mu.Lock()
	b.bucketLocked(now).calls++
	b.mu.Unlock()
}

// tryRetry spends one retry if the budget allows it.
func (b *budget) tryRetry(now time.Time) bool {
	b.mu.Lock()
	defer b.mu.Unlock()
	calls, retries := b.sumsLocked(now)
	if retries*100 >= calls*b.pct+b.floor*100 {
		return false
	}
	b.bucketLocked(now).retries++
	return true
}
