package fanout

import (
	"slices"
	"strings"
	"sync"

	"github.com/regcluster/registry/cache"
	registryv1 "github.com/regcluster/registry/proto/registry/v1"
)

// maxPending bounds the puts a store remembers between two builds of
// their service's part; past it they are forgotten, and a snapshot encodes
// those instances itself (as it would without a store).
const maxPending = 1 << 14

// store is the hub's one encoded element per instance, shared by every
// feed: the elements the watcher made from etcd's stored bytes
// (record.Element), so that no instance is encoded again for a snapshot.
// It holds, per service, a part whose instances are the cache's own
// pointers (so a feed's newPart finds them by identity), rebuilt whole
// from every snapshot the watcher delivers and replaced by each part a
// feed builds later; and the elements of the puts applied since, until a
// part of their service is built.
//
// Identity is what makes it safe: a feed takes an element from the store
// only for the very *Instance it was made for (see newPart). The one place
// a record is matched otherwise is reset, where the cache keeps its old
// *Instance for a record the snapshot brings again (same key, same mod
// and create revision within one epoch: the same put, so the same bytes).
// A feed encodes what the store does not hold, as it would without one.
type store struct {
	mu      sync.Mutex
	epoch   string
	parts   map[string]storedPart
	pending map[string][]pendingPut
	npend   int
}

type storedPart struct {
	p   *bodyPart
	rev int64 // revision of the snapshot its instances are from
}

// pendingPut is the element of one put, applied at rev.
type pendingPut struct {
	inst *registryv1.Instance
	elem []byte
	rev  int64
}

func newStore() *store {
	return &store{parts: map[string]storedPart{}, pending: map[string][]pendingPut{}}
}

// reset replaces everything with the elements of b, a snapshot the cache
// accepted, whose result is snap: each service's part holds snap's
// instances that b brought with an element (all of them, from the
// watcher). Called by the hub's apply only, after the cache took b, with
// Hub.mu held: O(instances) without an allocation per instance.
func (st *store) reset(snap *cache.Snapshot, b cache.Batch) {
	parts := map[string]storedPart{}
	if len(b.Encoded) == len(b.Instances) {
		for svc, r := range runsOf(b) {
			if p := matchPart(snap.Instances(svc), r, b.NewEpoch); p != nil {
				parts[svc] = storedPart{p: p, rev: b.Revision}
			}
		}
	}
	st.mu.Lock()
	defer st.mu.Unlock()
	st.epoch, st.parts = b.Epoch, parts
	clear(st.pending)
	st.npend = 0
}

// run is one service's instances of a snapshot batch, sorted by id, each
// id once, with their elements (nil: none), parallel.
type run struct {
	insts []*registryv1.Instance
	elems [][]byte
}

// runsOf returns b's instances by service. etcd lists a prefix in key
// order, so each service is one run of b already sorted by id: the runs
// are then slices of b itself. Anything else (a service in two runs, ids
// out of order or repeated, a nil entry) is sorted out in a copy, the
// last of a repeated id winning as in the cache. (An entry without a key
// matches nothing: the cache holds none.)
func runsOf(b cache.Batch) map[string]run {
	runs := map[string]run{}
	for i := 0; i < len(b.Instances); {
		in := b.Instances[i]
		if in == nil {
			return sortedRuns(b)
		}
		k := i + 1
		for k < len(b.Instances) {
			next := b.Instances[k]
			if next == nil || next.Service != in.Service {
				break
			}
			if next.Id <= b.Instances[k-1].Id {
				return sortedRuns(b)
			}
			k++
		}
		if _, ok := runs[in.Service]; ok {
			return sortedRuns(b)
		}
		runs[in.Service] = run{insts: b.Instances[i:k:k], elems: b.Encoded[i:k:k]}
		i = k
	}
	return runs
}

// sortedRuns is runsOf's slow path, for a batch not in key order.
func sortedRuns(b cache.Batch) map[string]run {
	type entry struct {
		inst *registryv1.Instance
		elem []byte
	}
	by := map[string][]entry{}
	for i, in := range b.Instances {
		if in == nil {
			continue
		}
		by[in.Service] = append(by[in.Service], entry{in, b.Encoded[i]})
	}
	runs := make(map[string]run, len(by))
	for svc, l := range by {
		slices.SortStableFunc(l, func(a, b entry) int { return strings.Compare(a.inst.Id, b.inst.Id) })
		var r run
		for i, e := range l {
			if i+1 < len(l) && l[i+1].inst.Id == e.inst.Id {
				continue // a later one of the same id wins
			}
			r.insts, r.elems = append(r.insts, e.inst), append(r.elems, e.elem)
		}
		runs[svc] = r
	}
	return runs
}

// matchPart returns the part of cached (the cache's instances of one
// service, sorted by id) whose elements got holds, or nil if none. An
// instance takes the element of got's entry for its id when it is that
// entry's instance or the same record (see sameRecord): the cache keeps
// its old *Instance for a record the snapshot brings again.
func matchPart(cached []*registryv1.Instance, got run, newEpoch bool) *bodyPart {
	elems := make([][]byte, len(cached))
	n, j := 0, 0
	for i, in := range cached {
		if j < len(got.insts) && got.insts[j].Id != in.Id {
			for j < len(got.insts) && got.insts[j].Id < in.Id {
				j++
			}
		}
		if j < len(got.insts) && got.insts[j].Id == in.Id && got.elems[j] != nil && sameRecord(in, got.insts[j], newEpoch) {
			elems[i] = got.elems[j]
			n++
		}
	}
	switch n {
	case 0:
		return nil
	case len(cached):
		// The usual case: the part is the cache's own slice.
		return &bodyPart{insts: cached, elems: elems}
	}
	p := &bodyPart{insts: make([]*registryv1.Instance, 0, n), elems: make([][]byte, 0, n)}
	for i, e := range elems {
		if e != nil {
			p.insts, p.elems = append(p.insts, cached[i]), append(p.elems, e)
		}
	}
	return p
}

// sameRecord reports whether the cache's instance a is the record b of a
// snapshot, both of one key (matchPart walks by id within one service):
// the same pointer, or within one epoch the same put (same mod and create
// revision). Across epochs (newEpoch) only the pointer: the
// cache compares content there, and doing it again for every record under
// the hub's lock would cost more than encoding the few a restore keeps.
func sameRecord(a, b *registryv1.Instance, newEpoch bool) bool {
	switch {
	case a == b:
		return true
	case newEpoch:
		return false
	}
	return a.ModRevision != 0 && a.ModRevision == b.ModRevision && a.CreateRevision == b.CreateRevision
}

// put remembers the elements of the puts of b, a transaction the cache
// accepted. Called by the hub's apply only, with Hub.mu held, so that any
// snapshot including b finds them.
func (st *store) put(b cache.Batch) {
	st.mu.Lock()
	defer st.mu.Unlock()
	for _, e := range b.Events {
		if e.Type != cache.Put || e.Instance == nil || e.Encoded == nil {
			continue
		}
		if st.npend >= maxPending {
			clear(st.pending)
			st.npend = 0
		}
		svc := e.Instance.Service
		st.pending[svc] = append(st.pending[svc], pendingPut{e.Instance, e.Encoded, b.Revision})
		st.npend++
	}
}

// sources returns the stored part of service and a lookup of the
// elements of its pending puts, by instance.
func (st *store) sources(service string) (*bodyPart, func(*registryv1.Instance) []byte) {
	st.mu.Lock()
	defer st.mu.Unlock()
	sp := st.parts[service]
	pend := st.pending[service]
	if len(pend) == 0 {
		return sp.p, nil
	}
	pend = slices.Clone(pend)
	var m map[*registryv1.Instance][]byte
	return sp.p, func(in *registryv1.Instance) []byte {
		if m == nil {
			m = make(map[*registryv1.Instance][]byte, len(pend))
			for _, p := range pend {
				m[p.inst] = p.elem
			}
		}
		return m[in]
	}
}

// keep stores p, a part of service built from a snapshot at rev of epoch
// ep, if it is at least as recent as the one stored, and forgets the
// pending puts it covers.
func (st *store) keep(service string, p *bodyPart, ep string, rev int64) {
	st.mu.Lock()
	defer st.mu.Unlock()
	if ep != st.epoch || rev < st.parts[service].rev {
		return
	}
	st.parts[service] = storedPart{p: p, rev: rev}
	pend := st.pending[service]
	kept := pend[:0]
	for _, x := range pend {
		if x.rev > rev {
			kept = append(kept, x)
		}
	}
	clear(pend[len(kept):])
	st.npend -= len(pend) - len(kept)
	if len(kept) == 0 {
		delete(st.pending, service)
	} else {
		st.pending[service] = kept
	}
}
