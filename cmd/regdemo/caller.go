package main

import (
	"context"
	"fmt"
	"io"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/types/known/wrapperspb"

	"github.com/regcluster/registry/balance"
)

// Try is one attempt of a call: the instance the balancer picked and the
// code it answered.
type Try struct {
	ID   string
	Code codes.Code
}

// Call is one call of the client, with every attempt the SDK made for it.
type Call struct {
	Seq       int
	At        time.Time // when it started
	Phase     int       // index into the story's phases at the start
	PhaseName string
	Tries     []Try
	Answer    string // the instance that answered, "" if the call failed
	Err       error
	Duration  time.Duration
}

// reached reports whether any attempt of the call went to id.
func (c Call) reached(id string) bool {
	for _, t := range c.Tries {
		if t.ID == id {
			return true
		}
	}
	return false
}

type attemptsKey struct{}

type attemptsHolder struct{ got []balance.Attempt }

// recordAttempts is chained after the SDK's retry interceptor, so it runs
// once per attempt with the SDK's record of the call: the caller finds
// every attempt in its holder once the call returns.
func recordAttempts(ctx context.Context, method string, req, reply any, cc *grpc.ClientConn, invoker grpc.UnaryInvoker, opts ...grpc.CallOption) error {
	err := invoker(ctx, method, req, reply, cc, opts...)
	if h, ok := ctx.Value(attemptsKey{}).(*attemptsHolder); ok {
		h.got = balance.Attempts(ctx)
	}
	return err
}

// Caller calls Work through registry:///demo ten times a second, one call
// at a time, prints a line per call and keeps them all.
type Caller struct {
	cc    *grpc.ClientConn
	out   io.Writer
	start time.Time
	phase func() (int, string)

	mu struct {
		sync.Mutex
		calls []Call
	}
	quiet  bool // guarded by mu
	slow   atomic.Bool
	cancel context.CancelFunc
	done   chan struct{}
}

// callInterval is the seed client's loop, ten times faster.
const callInterval = 100 * time.Millisecond

// StartCaller starts calling; phase names the story's phase of each call.
func StartCaller(cc *grpc.ClientConn, out io.Writer, start time.Time, phase func() (int, string)) *Caller {
	ctx, cancel := context.WithCancel(context.Background())
	c := &Caller{cc: cc, out: out, start: start, phase: phase, cancel: cancel, done: make(chan struct{})}
	go c.run(ctx)
	return c
}

func (c *Caller) run(ctx context.Context) {
	defer close(c.done)
	t := time.NewTicker(callInterval)
	defer t.Stop()
	for seq := 1; ; seq++ {
		select {
		case <-ctx.Done():
			return
		case <-t.C:
		}
		call := c.call(ctx, seq)
		if ctx.Err() != nil && call.Err != nil {
			return // cut short by Stop: not the story's failure
		}
		c.mu.Lock()
		c.mu.calls = append(c.mu.calls, call)
		c.mu.Unlock()
		c.print(call)
	}
}

func (c *Caller) call(ctx context.Context, seq int) Call {
	phase, name := c.phase()
	call := Call{Seq: seq, At: time.Now(), Phase: phase, PhaseName: name}
	h := &attemptsHolder{}
	cctx, cancel := context.WithTimeout(context.WithValue(ctx, attemptsKey{}, h), 2*time.Second)
	defer cancel()
	resp := new(wrapperspb.StringValue)
	req := fmt.Sprintf("call %d", seq)
	if c.slow.Load() {
		req = slowWork
	}
	call.Err = c.cc.Invoke(cctx, workMethod, wrapperspb.String(req), resp)
	call.Duration = time.Since(call.At)
	if call.Err == nil {
		call.Answer = resp.GetValue()
	}
	for _, a := range h.got {
		call.Tries = append(call.Tries, Try{ID: a.ID, Code: status.Code(a.Err)})
	}
	return call
}

func (c *Caller) print(call Call) {
	c.mu.Lock()
	quiet := c.quiet
	c.mu.Unlock()
	if quiet {
		return
	}
	var b strings.Builder
	if call.Err == nil {
		fmt.Fprintf(&b, "-> %s", call.Answer)
	} else {
		fmt.Fprintf(&b, "FAILED %s: %s", status.Code(call.Err), status.Convert(call.Err).Message())
	}
	if len(call.Tries) > 1 || (len(call.Tries) == 1 && call.Err != nil) {
		var tries []string
		for _, t := range call.Tries {
			tries = append(tries, t.ID+" "+t.Code.String())
		}
		fmt.Fprintf(&b, "   (attempts: %s)", strings.Join(tries, ", "))
	}
	fmt.Fprintf(c.out, "%6.1fs  call %-4d %-30s %s\n", call.At.Sub(c.start).Seconds(), call.Seq, call.PhaseName, b.String())
}

// Calls returns a copy of the calls so far.
func (c *Caller) Calls() []Call {
	c.mu.Lock()
	defer c.mu.Unlock()
	return append([]Call(nil), c.mu.calls...)
}

// Len is the number of calls made so far.
func (c *Caller) Len() int {
	c.mu.Lock()
	defer c.mu.Unlock()
	return len(c.mu.calls)
}

// SetQuiet stops (or resumes) the per-call lines.
func (c *Caller) SetQuiet(q bool) {
	c.mu.Lock()
	c.quiet = q
	c.mu.Unlock()
}

// SetSlow makes the calls ask for slow work (or not).
func (c *Caller) SetSlow(s bool) { c.slow.Store(s) }

// Stop ends the calls and waits for the loop.
func (c *Caller) Stop() {
	c.cancel()
	<-c.done
}
