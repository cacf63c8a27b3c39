package balance

import (
	"testing"
	"time"

	"google.golang.org/grpc/balancer"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
)

// A success on an endpoint with no recorded failure does not take the
// channel's outlier lock (held here: with the lock the call would never
// return), and neither does a neutral end; after a failure, a success
// takes it and clears the count.
func TestDoneSuccessTakesNoLock(t *testing.T) {
	b := &lb{eps: map[string]*endpoint{}}
	ep := &endpoint{key: "a", owner: b}
	sh := &shared{policy: DefaultPolicy(), metrics: NewMetrics()}
	b.ejectMu.Lock()
	finished := make(chan struct{})
	go func() {
		defer close(finished)
		b.done(ep, sh, balancer.DoneInfo{}, false)
		b.done(ep, sh, balancer.DoneInfo{Err: status.Error(codes.NotFound, "an answer")}, false)
		b.done(ep, sh, balancer.DoneInfo{Err: status.Error(codes.Canceled, "the caller left")}, false)
	}()
	select {
	case <-finished:
		b.ejectMu.Unlock()
	case <-time.After(time.Minute): // a guard: with the lock taken they never finish
		b.ejectMu.Unlock()
		<-finished
		t.Fatal("Done of a success waited for the ejection lock")
	}

	b.done(ep, sh, balancer.DoneInfo{Err: status.Error(codes.Unavailable, "down")}, false)
	if n := ep.fails.Load(); n != 1 {
		t.Fatalf("consecutive failures %d after one, want 1", n)
	}
	b.done(ep, sh, balancer.DoneInfo{}, false)
	if n := ep.fails.Load(); n != 0 {
		t.Fatalf("consecutive failures %d after a success, want 0", n)
	}
}
