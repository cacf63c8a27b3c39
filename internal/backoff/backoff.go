// Package backoff is the registry's one retry delay: exponential from a
// first step, capped, with "equal jitter" (half of each step fixed, half
// random), so that the many clients a failure hit at once do not retry at
// once, and no wait is shorter than half its step. Every retry loop of the
// registry (lease renewal, the etcd watch, the SDK's resubscribe, the
// election, the data plane's retries) waits through it.
//
// grpc-go's own exponential strategy is internal to it (its public
// backoff.Config only configures connection backoff), and its jitter can
// exceed the cap; this one never waits longer than Max.
package backoff

import (
	"context"
	"math/rand/v2"
	"time"
)

// Exponential is a jittered exponential backoff: step n is
// min(Min·2ⁿ, Max), and the wait is uniform in [step/2, step].
type Exponential struct {
	// Min is the first step (attempt 0); Max caps every step. A Max
	// below Min caps Min too.
	Min, Max time.Duration
}

// Step is the unjittered step of attempt (0 for the first retry):
// min(Min·2^attempt, Max), never overflowing.
func (e Exponential) Step(attempt int) time.Duration {
	d := e.Min
	for i := 0; i < attempt && d < e.Max; i++ {
		if d > e.Max/2 {
			d = e.Max
			break
		}
		d *= 2
	}
	return max(0, min(d, e.Max))
}

// Delay is the wait before retry number attempt (0 for the first): uniform
// in [Step/2, Step]. It is safe for concurrent use.
func (e Exponential) Delay(attempt int) time.Duration {
	d := e.Step(attempt)
	return d/2 + rand.N(d-d/2+1)
}

// Sleep waits d, or until ctx ends; it reports whether d passed.
func Sleep(ctx context.Context, d time.Duration) bool {
	t := time.NewTimer(d)
	defer t.Stop()
	select {
	case <-t.C:
		return true
	case <-ctx.Done():
		return false
	}
}
