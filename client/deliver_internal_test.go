package client

import (
	"context"
	"fmt"
	"log/slog"
	"runtime"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/regcluster/registry/cache"
	registryv1 "github.com/regcluster/registry/proto/registry/v1"
)

// heldCallbacks are the callbacks of a Subscription fed by the test
// itself (feed), on a Client whose one endpoint nobody serves: the first
// change blocks until release, everything is recorded.
type heldCallbacks struct {
	mu      sync.Mutex
	changes []Change
	blocked chan struct{}
	release chan struct{}
}

func (h *heldCallbacks) onChange(ch Change) {
	h.mu.Lock()
	h.changes = append(h.changes, ch)
	first := len(h.changes) == 1
	h.mu.Unlock()
	if first {
		close(h.blocked)
		<-h.release
	}
}

func heldSubscription(t *testing.T, backlog int) (*Subscription, *heldCallbacks) {
	t.Helper()
	c, err := New(Config{Endpoints: []string{"127.0.0.1:1"}, Logger: slog.New(slog.DiscardHandler)})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { c.Close() })
	h := &heldCallbacks{blocked: make(chan struct{}), release: make(chan struct{})}
	s, err := c.Subscribe(context.Background(), "orders", SubscribeOptions{OnChange: h.onChange, CallbackBacklog: backlog})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		select {
		case <-h.release:
		default:
			close(h.release)
		}
		s.Close()
	})
	return s, h
}

// feed applies b as a stream's unit would be.
func (s *Subscription) feed(t testing.TB, b cache.Batch) {
	t.Helper()
	s.applyMu.Lock()
	defer s.applyMu.Unlock()
	if err := s.apply(b, nil, nil); err != nil {
		t.Fatal(err)
	}
}

func instance(id string, rev int64) *registryv1.Instance {
	return &registryv1.Instance{Service: "orders", Id: id, Address: "10.0.0.1:80", ModRevision: rev}
}

func (h *heldCallbacks) waitFor(t *testing.T, what string, cond func() bool) {
	t.Helper()
	deadline := time.Now().Add(time.Minute)
	for {
		h.mu.Lock()
		ok := cond()
		h.mu.Unlock()
		if ok {
			return
		}
		if time.Now().After(deadline) {
			t.Fatalf("timed out waiting for %s", what)
		}
		time.Sleep(5 * time.Millisecond)
	}
}

// Heartbeats waiting behind a blocked OnChange are merged into the
// latest: any number of them takes one place in the backlog, and never
// costs a snapshot.
func TestWaitingHeartbeatsAreMerged(t *testing.T) {
	s, h := heldSubscription(t, 2)
	s.feed(t, cache.Batch{Revision: 10, Snapshot: true, Instances: []*registryv1.Instance{instance("a", 10)}})
	<-h.blocked
	s.feed(t, cache.Batch{Revision: 11, Events: []cache.Event{{Type: cache.Put, Service: "orders", ID: "b", Instance: instance("b", 11)}}})
	for rev := int64(12); rev < 40; rev++ {
		s.feed(t, cache.Batch{Revision: rev})
	}
	close(h.release)
	h.waitFor(t, "the heartbeats", func() bool { return h.changes[len(h.changes)-1].Revision == 39 })
	h.mu.Lock()
	defer h.mu.Unlock()
	if len(h.changes) != 3 {
		t.Fatalf("%d changes, want the snapshot, b added, and one heartbeat", len(h.changes))
	}
	if ch := h.changes[1]; ch.Revision != 11 || ch.Progress || len(ch.Added) != 1 {
		t.Fatalf("second change %+v, want b added at 11", ch)
	}
	if ch := h.changes[2]; ch.Revision != 39 || !ch.Progress {
		t.Fatalf("third change %+v, want the latest heartbeat, 39", ch)
	}
	if n := s.deliver.coalescings(); n != 0 {
		t.Fatalf("heartbeats coalesced %d times", n)
	}
}

// A coalescing keeps what the changes it dropped said: a new epoch among
// them (etcd restored: revisions start over) makes the snapshot a
// NewEpoch one, so a consumer does not take the lower revision for a
// rewind.
func TestCoalescingKeepsNewEpoch(t *testing.T) {
	s, h := heldSubscription(t, 1)
	s.feed(t, cache.Batch{Revision: 100, Snapshot: true, Instances: []*registryv1.Instance{instance("a", 100)}})
	<-h.blocked
	s.feed(t, cache.Batch{Revision: 101, Events: []cache.Event{{Type: cache.Delete, Service: "orders", ID: "a"}}})
	s.feed(t, cache.Batch{Revision: 5, Snapshot: true, Reset: true, NewEpoch: true, Instances: []*registryv1.Instance{instance("c", 5)}})
	for rev := int64(6); rev < 9; rev++ {
		s.feed(t, cache.Batch{Revision: rev, Events: []cache.Event{{Type: cache.Put, Service: "orders", ID: fmt.Sprint("d", rev), Instance: instance(fmt.Sprint("d", rev), rev)}}})
	}
	close(h.release)
	h.waitFor(t, "the snapshot", func() bool { return len(h.changes) == 2 })
	h.mu.Lock()
	ch := h.changes[1]
	h.mu.Unlock()
	if !ch.Snapshot || !ch.Reset || !ch.NewEpoch || ch.Revision != 8 || len(ch.Instances) != 4 {
		t.Fatalf("coalesced change %+v (%d instances), want a reset, new-epoch snapshot of 4 instances at 8", ch, len(ch.Instances))
	}
	if n := s.deliver.coalescings(); n != 1 {
		t.Fatalf("coalesced %d times, want 1", n)
	}
}

// The Changes channel's snapshot after an overflow is NewEpoch when a
// change it dropped was (it used to say nothing of it: a reader saw the
// revision go back with no new epoch).
func TestChangesOverflowKeepsNewEpoch(t *testing.T) {
	c, err := New(Config{Endpoints: []string{"127.0.0.1:1"}, Logger: slog.New(slog.DiscardHandler)})
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	s, err := c.Subscribe(context.Background(), "orders", SubscribeOptions{Changes: 1})
	if err != nil {
		t.Fatal(err)
	}
	defer s.Close()
	s.feed(t, cache.Batch{Revision: 100, Snapshot: true, Instances: []*registryv1.Instance{instance("a", 100)}})
	s.feed(t, cache.Batch{Revision: 5, Snapshot: true, Reset: true, NewEpoch: true, Instances: []*registryv1.Instance{instance("c", 5)}})
	s.feed(t, cache.Batch{Revision: 6, Events: []cache.Event{{Type: cache.Put, Service: "orders", ID: "d", Instance: instance("d", 6)}}})
	if ch := <-s.Changes(); ch.Revision != 100 {
		t.Fatalf("first change at %d, want the first snapshot's 100", ch.Revision)
	}
	s.feed(t, cache.Batch{Revision: 7, Events: []cache.Event{{Type: cache.Put, Service: "orders", ID: "e", Instance: instance("e", 7)}}})
	ch := <-s.Changes()
	if !ch.Snapshot || !ch.NewEpoch || ch.Revision != 7 || len(ch.Instances) != 3 {
		t.Fatalf("after the overflow %+v (%d instances), want a new-epoch snapshot of 3 instances at 7", ch, len(ch.Instances))
	}
}

// The cost of a change's way to its callback, applying included: on the
// applying goroutine (a listener, as the resolvers' are) and through the
// callbacks' queue and goroutine (OnChange), one event per change.
func BenchmarkChangeToCallback(b *testing.B) {
	for _, async := range []bool{false, true} {
		name := map[bool]string{false: "listener", true: "OnChange"}[async]
		b.Run(name, func(b *testing.B) {
			c, err := New(Config{Endpoints: []string{"127.0.0.1:1"}, Logger: slog.New(slog.DiscardHandler)})
			if err != nil {
				b.Fatal(err)
			}
			defer c.Close()
			var got atomic.Int64
			on := func(ch Change) { got.Store(ch.Revision) }
			opts := SubscribeOptions{}
			if async {
				opts.OnChange = on
			}
			s, err := c.Subscribe(context.Background(), "orders", opts)
			if err != nil {
				b.Fatal(err)
			}
			defer s.Close()
			if !async {
				s.listen(on)
			}
			s.feed(b, cache.Batch{Revision: 1, Snapshot: true})
			b.ResetTimer()
			for i := range b.N {
				rev := int64(i + 2)
				id := fmt.Sprint("i-", i%100)
				s.feed(b, cache.Batch{Revision: rev, Events: []cache.Event{{Type: cache.Put, Service: "orders", ID: id, Instance: instance(id, rev)}}})
			}
			for got.Load() < int64(b.N+1) {
				runtime.Gosched()
			}
			b.StopTimer()
			b.ReportMetric(float64(s.Stats().Coalesced), "coalesced")
		})
	}
}
