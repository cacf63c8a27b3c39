package balance

import (
	"context"
	"sync"
	"sync/atomic"

	"google.golang.org/grpc/balancer"
)

type callKey struct{}

// call is one logical call across its attempts: the retry interceptor
// makes it the context of every attempt (it is a context.Context over
// the caller's, answering Value(callKey{}) with itself: one allocation
// for both), the picker reads the instances already tried from it and
// records each attempt. All methods accept a nil *call (a call made
// without the interceptor).
type call struct {
	context.Context

	sh atomic.Pointer[shared] // the policy of the last picker that saw the call
	n  atomic.Int32           // len(attempts), read without mu by the picker

	mu       sync.Mutex
	attempts []attempt // in buf until a call makes more than len(buf) attempts
	buf      [1]attempt
	final    bool // the picker said a retry cannot help
}

type attempt struct {
	key, id string
	done    bool
	sent    bool // any byte of the request reached the wire
	err     error

	// What the attempt's Done does besides recording it.
	ep    *endpoint
	sh    *shared
	probe bool
	next  func(balancer.DoneInfo) // the child's Done
}

func newCall(ctx context.Context) *call {
	c := &call{Context: ctx}
	c.attempts = c.buf[:0]
	return c
}

// Value makes the call findable from the contexts of its attempts.
func (c *call) Value(key any) any {
	if _, ok := key.(callKey); ok {
		return c
	}
	return c.Context.Value(key)
}

func callFrom(ctx context.Context) *call {
	if ctx == nil {
		return nil
	}
	c, _ := ctx.Value(callKey{}).(*call)
	return c
}

func (c *call) bind(sh *shared) {
	if c != nil && c.sh.Load() != sh {
		c.sh.Store(sh)
	}
}

func (c *call) shared() *shared { return c.sh.Load() }

func (c *call) anyTried() bool { return c != nil && c.n.Load() > 0 }

func (c *call) tried(key string) bool {
	if c == nil || c.n.Load() == 0 {
		return false
	}
	c.mu.Lock()
	defer c.mu.Unlock()
	for i := range c.attempts {
		if c.attempts[i].key == key {
			return true
		}
	}
	return false
}

// record adds an attempt on ep and returns its Done: it records the
// attempt's end, then does what every pick's Done does (in-flight count,
// outlier detection) and calls the child's Done.
func (c *call) record(x *cand, sh *shared, probe bool, next func(balancer.DoneInfo)) func(balancer.DoneInfo) {
	c.mu.Lock()
	i := len(c.attempts)
	c.attempts = append(c.attempts, attempt{key: x.ep.key, id: x.id, ep: x.ep, sh: sh, probe: probe, next: next})
	c.n.Store(int32(len(c.attempts)))
	c.mu.Unlock()
	return func(di balancer.DoneInfo) { c.finish(i, di) }
}

func (c *call) finish(i int, di balancer.DoneInfo) {
	c.mu.Lock()
	a := &c.attempts[i]
	a.done, a.sent, a.err = true, di.BytesSent, di.Err
	ep, sh, probe, next := a.ep, a.sh, a.probe, a.next
	c.mu.Unlock()
	ep.inflight.Add(-1)
	ep.owner.done(ep, sh, di, probe)
	if next != nil {
		next(di)
	}
}

func (c *call) markFinal() {
	c.mu.Lock()
	c.final = true
	c.mu.Unlock()
}

// unprocessedSince tells whether every attempt after the first n
// certainly did not reach the application (none was picked, or none sent
// a byte).
func (c *call) unprocessedSince(n int) bool {
	c.mu.Lock()
	defer c.mu.Unlock()
	for _, a := range c.attempts[n:] {
		if !a.done || a.sent {
			return false
		}
	}
	return true
}

func (c *call) count() int { return int(c.n.Load()) }

func (c *call) isFinal() bool {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.final
}

// Attempt is one attempt of a call as the picker recorded it.
type Attempt struct {
	// ID and Address of the instance picked.
	ID, Address string
	// Sent tells whether any byte of the request was sent.
	Sent bool
	// Err is the attempt's error (nil: success).
	Err error
}

// Attempts returns the attempts recorded so far for the call of ctx, a
// context given to a grpc.UnaryClientInterceptor chained after ours (nil
// without our interceptor).
func Attempts(ctx context.Context) []Attempt {
	c := callFrom(ctx)
	if c == nil {
		return nil
	}
	c.mu.Lock()
	defer c.mu.Unlock()
	out := make([]Attempt, len(c.attempts))
	for i, a := range c.attempts {
		out[i] = Attempt{ID: a.id, Address: a.key, Sent: a.sent, Err: a.err}
	}
	return out
}
