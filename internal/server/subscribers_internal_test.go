package server

import (
	"context"
	"testing"
	"time"

	registryv1 "github.com/regcluster/registry/proto/registry/v1"
)

func closed(ch <-chan struct{}) bool {
	select {
	case <-ch:
		return true
	default:
		return false
	}
}

// A Watch stream's send wakes the table's waiters only when it crosses a
// revision one waits for; without a waiter it touches nothing shared but
// two atomics.
func TestWatchSendNotifiesOnlyACrossing(t *testing.T) {
	var tab subscribers
	w := tab.addWatch("alpha", "w", "127.0.0.1:1", 3)
	_, ch := tab.pending("alpha", 10)
	tab.sent(w, 5)
	if closed(ch) {
		t.Fatal("a send with nobody waiting woke the table")
	}
	done := tab.wait("alpha", 10)
	_, ch = tab.pending("alpha", 10)
	tab.sent(w, 7)
	if closed(ch) {
		t.Fatal("a send below the revision waited for woke the table")
	}
	tab.sent(w, 12)
	if !closed(ch) {
		t.Fatal("the send that crossed the revision waited for did not wake the table")
	}
	_, ch = tab.pending("alpha", 10)
	tab.sent(w, 14)
	if closed(ch) {
		t.Fatal("a send past the revision waited for woke the table again")
	}
	done()
	if lo, hi := tab.lo.Load(), tab.hi.Load(); lo != 0 || hi != 0 {
		t.Fatalf("after the wait: lo %d, hi %d, want 0, 0", lo, hi)
	}
}

// pending counts Watch streams of the service and of every service, apart
// from the acknowledging subscribers, by the revision each was sent (its
// resume point before anything).
func TestPendingCountsWatchStreams(t *testing.T) {
	var tab subscribers
	sent := tab.addWatch("alpha", "b", "127.0.0.1:2", 0)
	tab.sent(sent, 10)
	tab.addWatch("", "a", "127.0.0.1:1", 4)
	tab.addWatch("alpha", "", "127.0.0.1:3", 12) // resumed past it
	gone := tab.addWatch("alpha", "gone", "127.0.0.1:4", 0)
	tab.removeWatch(gone)
	tab.addWatch("beta", "other", "127.0.0.1:5", 0)
	n, _ := tab.pending("alpha", 10)
	if n.Subscribers != 0 || n.Pending != 0 || n.WatchStreams != 3 || n.WatchPending != 1 || len(n.WatchLaggards) != 1 {
		t.Fatalf("pending: %v", n)
	}
	if l := n.WatchLaggards[0]; l.Subscriber != "a" || l.Peer != "127.0.0.1:1" || l.Revision != 4 {
		t.Fatalf("laggard: %v", l)
	}
}

// waitLocal, in progress, returns once the last Watch stream behind is
// sent the revision.
func TestWatchSendWakesWaiter(t *testing.T) {
	s := &Server{cfg: Config{Node: "n1", Addr: "127.0.0.1:7400"}}
	w := s.subs.addWatch("alpha", "w", "127.0.0.1:1", 0)
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	got := make(chan *registryv1.NodeApplied, 1)
	go func() { got <- s.waitLocal(ctx, "alpha", 10) }()
	deadline := time.Now().Add(30 * time.Second)
	for s.subs.hi.Load() != 10 { // the wait is in progress
		select {
		case n := <-got:
			t.Fatalf("waitLocal returned before the send: %v", n)
		default:
		}
		if time.Now().After(deadline) {
			t.Fatal("waitLocal never entered its waiter")
		}
		time.Sleep(10 * time.Millisecond)
	}
	s.subs.sent(w, 10)
	n := <-got
	if ctx.Err() != nil || n.WatchPending != 0 || n.WatchStreams != 1 || n.Node != "n1" {
		t.Fatalf("waitLocal after the send: %v (ctx %v)", n, ctx.Err())
	}
	if s.subs.hi.Load() != 0 {
		t.Fatal("waitLocal left its waiter behind")
	}
}

// The cost of a Watch stream's send to the table, each goroutine its own
// stream as on a regnode: with nobody waiting, and with a wait in
// progress for a revision the sends have not reached (the common case
// during a drain: only the one crossing send takes the lock).
func BenchmarkWatchSent(b *testing.B) {
	for _, waiting := range []bool{false, true} {
		b.Run(map[bool]string{false: "idle", true: "waiting"}[waiting], func(b *testing.B) {
			var tab subscribers
			if waiting {
				defer tab.wait("orders", 1<<62)()
			}
			b.RunParallel(func(pb *testing.PB) {
				w := tab.addWatch("alpha", "", "", 0)
				var rev int64
				for pb.Next() {
					rev++
					tab.sent(w, rev)
				}
			})
		})
	}
}

// For comparison, the design not taken: every send under the table's one
// lock (as acks are).
func BenchmarkWatchSentUnderLock(b *testing.B) {
	var tab subscribers
	b.RunParallel(func(pb *testing.PB) {
		w := tab.addWatch("alpha", "", "", 0)
		var rev int64
		for pb.Next() {
			rev++
			tab.mu.Lock()
			w.sent.Store(rev)
			tab.mu.Unlock()
		}
	})
}
