package prober

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"sync"
	"time"

	clientv3 "go.etcd.io/etcd/client/v3"
	"google.golang.org/protobuf/proto"

	"github.com/regcluster/registry/cache"
	"github.com/regcluster/registry/health"
	registryv1 "github.com/regcluster/registry/proto/registry/v1"
	"github.com/regcluster/registry/record"
	"github.com/regcluster/registry/store"
)

// writer writes health transitions off the probe loop, through the
// leader's fence. Submit never blocks on etcd: it puts the transition in
// the instance's slot and returns. Per instance at most one write is in
// flight; a transition submitted while another waits replaces it (latest
// wins), so what lands for an instance is a subsequence, in order, of its
// transitions, ending with the latest. Memory is one slot per instance
// written to and still followed (once idle, only the saved state's owner:
// no copy of the record), and the queue holds each key at most once.
//
// Each write is one round trip: a compare-and-swap on the newest copy of
// the record the writer knows (the view's, given with the transition, or
// the one its own last write produced while another transition waited),
// retried from a fresh read only on conflict (store.UpdateFrom).
type writer struct {
	st       *store.Store
	guard    []clientv3.Cmp
	log      *slog.Logger
	workers  int
	timeout  time.Duration // bounds one write
	onLanded func(health.Transition)
	// share, if set, gives the guard of each write, and says whether the
	// key is still this writer's to write (a job for one no longer is is
	// dropped); retryFenced: a write the guard refuses is tried again
	// (the share moved), rather than closing Fenced.
	share       func(cache.Key) (guard []clientv3.Cmp, fence int64, ok bool)
	retryFenced bool
	onFenced    func()

	mu     sync.Mutex
	slots  map[cache.Key]*slot
	queue  []cache.Key // keys with a pending transition and no write in flight
	wake   chan struct{}
	fenced chan struct{} // closed when the fence refused a write
	once   sync.Once

	// Counters, under mu, for tests and the benchmark.
	landed, coalesced int
}

// slot is one instance's writing state; under writer.mu.
type slot struct {
	base    *registryv1.Instance // the newest copy of the record known, while a write is due
	hint    store.StateHint
	pending *job // the latest transition not yet sent
	busy    bool // a write of this key is in flight
	queued  bool
	dropped bool // forgotten while busy: removed when the write returns
}

// job is one transition to write.
type job struct {
	create int64 // the incarnation it was observed on
	health *registryv1.Health
	tr     health.Transition
	tries  int
}

func newWriter(st *store.Store, guard []clientv3.Cmp, workers int, log *slog.Logger, onLanded func(health.Transition)) *writer {
	return &writer{st: st, guard: guard, log: log, workers: workers, timeout: 5 * time.Second, onLanded: onLanded,
		slots: map[cache.Key]*slot{}, wake: make(chan struct{}, 1), fenced: make(chan struct{})}
}

// run writes until ctx ends; it returns once every worker has.
func (w *writer) run(ctx context.Context) {
	var wg sync.WaitGroup
	for range w.workers {
		wg.Go(func() { w.work(ctx) })
	}
	wg.Wait()
}

// Fenced is closed once the fence refused a write: this node no longer
// leads.
func (w *writer) Fenced() <-chan struct{} { return w.fenced }

// submit queues tr for inst (the view's copy of the record, the
// incarnation it was observed on) and returns at once.
func (w *writer) submit(inst *registryv1.Instance, tr health.Transition, h *registryv1.Health) {
	key := cache.Key{Service: inst.Service, ID: inst.Id}
	w.mu.Lock()
	s := w.slots[key]
	if s == nil {
		s = &slot{}
		w.slots[key] = s
	}
	s.dropped = false
	if s.base == nil || inst.ModRevision > s.base.ModRevision {
		s.base = inst
	}
	if s.pending != nil {
		w.coalesced++
	}
	s.pending = &job{create: inst.CreateRevision, health: h, tr: tr}
	w.enqueue(key, s)
	w.mu.Unlock()
}

// enqueue puts key on the queue unless it is there or being written;
// under mu.
func (w *writer) enqueue(key cache.Key, s *slot) {
	if s.busy || s.queued || s.pending == nil {
		return
	}
	s.queued = true
	w.queue = append(w.queue, key)
	w.signal()
}

func (w *writer) signal() {
	select {
	case w.wake <- struct{}{}:
	default:
	}
}

// forget drops key's slot (the instance left the view): a pending
// transition is not written.
func (w *writer) forget(key cache.Key) {
	w.mu.Lock()
	defer w.mu.Unlock()
	s := w.slots[key]
	if s == nil {
		return
	}
	s.pending = nil
	if s.busy {
		s.dropped = true
		return
	}
	delete(w.slots, key)
}

// next takes the next key to write and its job, marking it busy; ok is
// false when the queue is empty.
func (w *writer) next() (key cache.Key, s *slot, j *job, base *registryv1.Instance, hint store.StateHint, ok bool) {
	w.mu.Lock()
	defer w.mu.Unlock()
	for len(w.queue) > 0 {
		key = w.queue[0]
		w.queue[0] = cache.Key{}
		w.queue = w.queue[1:]
		s = w.slots[key]
		if s == nil || !s.queued {
			continue // forgotten
		}
		s.queued = false
		if s.pending == nil {
			continue
		}
		j, s.pending, s.busy = s.pending, nil, true
		if len(w.queue) > 0 {
			w.signal() // another worker may take the next
		}
		return key, s, j, s.base, s.hint, true
	}
	w.queue = nil // let the array go once drained
	return key, nil, nil, nil, hint, false
}

func (w *writer) work(ctx context.Context) {
	for {
		key, s, j, base, hint, ok := w.next()
		if !ok {
			select {
			case <-ctx.Done():
				return
			case <-w.wake:
				continue
			}
		}
		retry := w.write(ctx, key, s, j, base, hint)
		if retry {
			// etcd trouble: the key stays busy through the backoff, so
			// nothing writes it sooner, and a newer transition submitted
			// meanwhile goes instead of this one.
			t := time.NewTimer(min(100*time.Millisecond<<min(j.tries, 6), 5*time.Second))
			select {
			case <-ctx.Done():
				t.Stop()
				return
			case <-t.C:
			}
		}
		w.mu.Lock()
		s.busy = false
		if retry && s.pending == nil && !s.dropped {
			s.pending = j
		}
		switch {
		case s.dropped:
			if w.slots[key] == s {
				delete(w.slots, key)
			}
		case s.pending == nil:
			// Idle: the view will hold the record written by the next
			// transition (they are probes apart), so the slot keeps only
			// the hint, not a copy of the record.
			s.base = nil
		default:
			w.enqueue(key, s)
		}
		w.mu.Unlock()
		if ctx.Err() != nil {
			return
		}
	}
}

// errLanded is a transition found already in etcd when it is written
// again (after a try whose answer was lost).
var errLanded = errors.New("the transition is already in etcd")

// write writes one transition; it returns true if it should be written
// again (etcd trouble), false when it landed or never will.
func (w *writer) write(ctx context.Context, key cache.Key, s *slot, j *job, base *registryv1.Instance, hint store.StateHint) bool {
	guard, health := w.guard, j.health
	if w.share != nil {
		g, fence, ok := w.share(key)
		if !ok {
			// The share moved: the new owner probes it before it writes.
			w.log.Info("health transition not written: the instance is no longer this regnode's", "instance", key.Service+"/"+key.ID, "to", j.tr.To.String())
			return false
		}
		guard = g
		if health.GetFence() != fence {
			// Written under the share's guard now, not the one it was
			// observed under: the record names the fence that let it in.
			health = proto.CloneOf(health)
			health.Fence = fence
		}
	}
	wctx, cancel := context.WithTimeout(ctx, w.timeout)
	defer cancel()
	next, hint, err := w.st.UpdateFrom(wctx, base, hint, guard, func(in *registryv1.Instance) error {
		if in.CreateRevision != j.create {
			return fmt.Errorf("%s/%s was registered anew: %w", key.Service, key.ID, record.ErrNotFound)
		}
		if proto.Equal(in.Health, health) {
			// An earlier try landed although its answer was lost (a
			// timeout): writing it again would be a put that is no
			// transition.
			return errLanded
		}
		in.Health = health
		return nil
	})
	w.mu.Lock()
	s.hint = hint
	if err == nil {
		// What it wrote is the newest record there is (whatever the
		// epoch: after an etcd restore revisions go down).
		s.base = next
	}
	if err == nil {
		w.landed++
	}
	w.mu.Unlock()
	switch {
	case errors.Is(err, errLanded):
		return false
	case err == nil:
		if w.onLanded != nil {
			w.onLanded(j.tr)
		}
		w.log.Info("health transition", "instance", key.Service+"/"+key.ID, "from", j.tr.From.String(), "to", j.tr.To.String(), "reason", j.tr.Reason)
		return false
	case errors.Is(err, store.ErrGuard) && w.retryFenced:
		if w.onFenced != nil {
			w.onFenced()
		}
		j.tries++
		w.log.Info("health write refused by the share's fence (the membership moved); trying under the next", "instance", key.Service+"/"+key.ID, "tries", j.tries)
		return true
	case errors.Is(err, store.ErrGuard):
		if w.onFenced != nil {
			w.onFenced()
		}
		w.log.Error("health write refused by the fence: no longer the leader", "instance", key.Service+"/"+key.ID)
		w.once.Do(func() { close(w.fenced) })
		return false
	case errors.Is(err, record.ErrNotFound):
		return false // gone or registered anew: the view will say so
	case errors.Is(err, record.ErrInvalid):
		w.log.Error("health transition not written: the record would not be valid", "instance", key.Service+"/"+key.ID, "to", j.tr.To, "err", err)
		return false
	case ctx.Err() != nil:
		return false
	default:
		j.tries++
		w.log.Error("health transition not written; retrying", "instance", key.Service+"/"+key.ID, "to", j.tr.To, "tries", j.tries, "err", err)
		return true
	}
}

// stats returns the writes landed and the transitions replaced unwritten.
func (w *writer) stats() (landed, coalesced int) {
	w.mu.Lock()
	defer w.mu.Unlock()
	return w.landed, w.coalesced
}
