package balance

import (
	"context"
	"sync"

	"google.golang.org/grpc/balancer"
)

type callKey struct{}

// call is one logical call across its attempts: the retry interceptor
// puts it in the context, the picker reads the instances already tried
// from it and records each attempt. All methods accept a nil *call (a
// call made without the interceptor).
type call struct {
	mu       sync.Mutex
	attempts []*attempt
	final    bool // the picker said a retry cannot help
	sh       *shared
}

type attempt struct {
	key, id string
	done    bool
	sent    bool // any byte of the request reached the wire
	err     error
}

func callFrom(ctx context.Context) *call {
	if ctx == nil {
		return nil
	}
	c, _ := ctx.Value(callKey{}).(*call)
	return c
}

func (c *call) bind(sh *shared) {
	if c == nil {
		return
	}
	c.mu.Lock()
	c.sh = sh
	c.mu.Unlock()
}

func (c *call) shared() *shared {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.sh
}

func (c *call) anyTried() bool {
	if c == nil {
		return false
	}
	c.mu.Lock()
	defer c.mu.Unlock()
	return len(c.attempts) > 0
}

func (c *call) tried(key string) bool {
	if c == nil {
		return false
	}
	c.mu.Lock()
	defer c.mu.Unlock()
	for _, a := range c.attempts {
		if a.key == key {
			return true
		}
	}
	return false
}

func (c *call) record(key, id string) *attempt {
	if c == nil {
		return nil
	}
	a := &attempt{key: key, id: id}
	c.mu.Lock()
	c.attempts = append(c.attempts, a)
	c.mu.Unlock()
	return a
}

func (c *call) finish(a *attempt, di balancer.DoneInfo) {
	if c == nil || a == nil {
		return
	}
	c.mu.Lock()
	a.done, a.sent, a.err = true, di.BytesSent, di.Err
	c.mu.Unlock()
}

func (c *call) markFinal() {
	c.mu.Lock()
	c.final = true
	c.mu.Unlock()
}

// since returns the number of attempts and whether every attempt after
// the first n certainly did not reach the application (none was picked,
// or none sent a byte).
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

func (c *call) count() int {
	c.mu.Lock()
	defer c.mu.Unlock()
	return len(c.attempts)
}

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
