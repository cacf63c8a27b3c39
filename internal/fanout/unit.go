package fanout

import (
	"fmt"
	"sync"
	"sync/atomic"

	"google.golang.org/protobuf/encoding/protowire"
	"google.golang.org/protobuf/proto"

	"github.com/regcluster/registry/cache"
	"github.com/regcluster/registry/internal/chunk"
	registryv1 "github.com/regcluster/registry/proto/registry/v1"
	"github.com/regcluster/registry/record"
)

// Unit is one thing a subscriber applies whole: a snapshot, the events of
// one transaction (or of the transactions a resuming subscriber missed),
// or progress, each at one revision of one epoch.
//
// A Unit is immutable and shared: the hub builds the unit of a transaction
// once per service and hands the same *Unit to every subscriber of that
// service (and every subscriber resetting at one revision shares one
// snapshot unit), and Chunks encodes it once, on first use, for all of
// them. Any stream that carries WatchResponse messages (Watch, or a
// multiplexed stream that embeds them) sends those bytes as they are.
type Unit struct {
	b cache.Batch

	// body, for a snapshot, holds the instances already encoded as
	// elements of Snapshot.instances (see snapshotBody); nil otherwise.
	body *snapshotBody

	once    sync.Once
	encoded atomic.Bool // once has run: the fast path, without a closure
	chunks  [][]byte
	err     error
}

// Batch is the unit's content: Revision and Epoch always; Snapshot, Reset,
// NewEpoch and Instances for a snapshot; Events for a transaction (of the
// subscriber's service only); neither for progress. It is shared with
// every subscriber and with the hub's cache: never modify it or what it
// holds.
func (u *Unit) Batch() cache.Batch { return u.b }

// Revision is the revision the unit brings its subscriber to.
func (u *Unit) Revision() int64 { return u.b.Revision }

// Chunks returns the unit as the WatchResponse messages that carry it, in
// order, already encoded: a progress is one message; a snapshot or an
// events unit is one or more, each at most chunk.MaxBytes (an element
// larger than that alone goes alone), all at the unit's revision and epoch
// and all but the last with more=true, exactly as chunk.Split frames it.
// The first call encodes; every later call, from any goroutine, returns
// the same slices. They are shared: never modify them.
//
// A stream whose messages embed a WatchResponse as a field (a multiplexed
// subscription response, say) need not decode them: the field's wire form
// is protowire.AppendTag(b, N, protowire.BytesType) followed by
// protowire.AppendBytes of a chunk.
func (u *Unit) Chunks() ([][]byte, error) {
	if !u.encoded.Load() {
		u.once.Do(func() {
			u.chunks, u.err = u.encode(chunk.MaxBytes)
			u.encoded.Store(true)
		})
	}
	return u.chunks, u.err
}

func (u *Unit) encode(maxBytes int) ([][]byte, error) {
	switch {
	case u.b.Snapshot:
		return u.body.chunks(u.b, maxBytes), nil
	case len(u.b.Events) == 0:
		b, err := proto.Marshal(&registryv1.WatchResponse{Revision: u.b.Revision, Epoch: u.b.Epoch,
			Kind: &registryv1.WatchResponse_Progress{Progress: &registryv1.Progress{}}})
		if err != nil {
			return nil, fmt.Errorf("encode progress at revision %d: %w", u.b.Revision, err)
		}
		return [][]byte{b}, nil
	}
	elems := make([][]byte, len(u.b.Events))
	for i, e := range u.b.Events {
		el, err := eventElement(e)
		if err != nil {
			return nil, fmt.Errorf("encode events at revision %d: %w", u.b.Revision, err)
		}
		elems[i] = el
	}
	each := func(f func([]byte)) {
		for _, e := range elems {
			f(e)
		}
	}
	return frameChunks(u.b, kindFrame{field: fieldWatchEvents, more: fieldEventsMore}, each, maxBytes), nil
}

// eventElement returns e as an element of Events.events (tag, length, the
// Event's bytes). A put's instance is its stored bytes (Event.Encoded)
// when the watcher forwarded them, and encoded here otherwise.
func eventElement(e cache.Event) ([]byte, error) {
	typ := registryv1.Event_TYPE_DELETE
	var inst []byte
	if e.Type == cache.Put {
		typ = registryv1.Event_TYPE_PUT
		if inst = record.ElementPayload(e.Encoded); inst == nil && e.Instance != nil {
			raw, err := proto.Marshal(e.Instance)
			if err != nil {
				return nil, fmt.Errorf("encode instance %s/%s: %w", e.Instance.GetService(), e.Instance.GetId(), err)
			}
			inst = raw
		}
	}
	n := protowire.SizeTag(fieldEventType) + protowire.SizeVarint(uint64(typ))
	if inst != nil {
		n += protowire.SizeTag(fieldEventInstance) + protowire.SizeBytes(len(inst))
	}
	if e.Service != "" {
		n += protowire.SizeTag(fieldEventService) + protowire.SizeBytes(len(e.Service))
	}
	if e.ID != "" {
		n += protowire.SizeTag(fieldEventID) + protowire.SizeBytes(len(e.ID))
	}
	w := make([]byte, 0, chunk.Cost(n))
	w = protowire.AppendTag(w, fieldEventsEvents, protowire.BytesType)
	w = protowire.AppendVarint(w, uint64(n))
	w = protowire.AppendTag(w, fieldEventType, protowire.VarintType)
	w = protowire.AppendVarint(w, uint64(typ))
	if inst != nil {
		w = protowire.AppendTag(w, fieldEventInstance, protowire.BytesType)
		w = protowire.AppendBytes(w, inst)
	}
	if e.Service != "" {
		w = protowire.AppendTag(w, fieldEventService, protowire.BytesType)
		w = protowire.AppendString(w, e.Service)
	}
	if e.ID != "" {
		w = protowire.AppendTag(w, fieldEventID, protowire.BytesType)
		w = protowire.AppendString(w, e.ID)
	}
	return w, nil
}

// Field numbers of the messages snapshotBody writes by hand; a test checks
// its output against proto.Unmarshal.
const (
	fieldWatchRevision = 1
	fieldWatchSnapshot = 2
	fieldWatchEvents   = 3
	fieldWatchEpoch    = 5
	fieldSnapInstances = 1
	fieldSnapReset     = 2
	fieldSnapNewEpoch  = 3
	fieldSnapMore      = 4
	fieldEventsEvents  = 1
	fieldEventsMore    = 2
	fieldEventType     = 1
	fieldEventInstance = 2
	fieldEventService  = 3
	fieldEventID       = 4
	boolFieldSize      = 2 // a tag under 16 and one byte
)

// snapshotBody is the instances of one snapshot, each already encoded as
// an element of Snapshot.instances (tag, length, the Instance's bytes), in
// snapshot order: one part per service. An element is, first choice, the
// one the watcher made from etcd's stored bytes (record.Element, kept in
// the hub's store, shared by every feed); else the one the feed's
// previous body holds for the same *Instance (the cache shares the
// *Instance of an unchanged record, and a service's slice between its
// snapshots until a batch touches it, so a whole part is often reused as
// it is); else it is encoded here. A relist or a put is therefore never
// encoded again, and a snapshot's chunks are copies of stored bytes.
type snapshotBody struct {
	parts []*bodyPart
	n     int // instances in all
}

// bodyPart is the encoded instances of one service: elems[i] is insts[i]
// as an element, insts sorted by id.
type bodyPart struct {
	insts []*registryv1.Instance
	elems [][]byte
}

// newBody encodes the instances of services (one slice per service, in
// snapshot order, each sorted by id), reusing the elements of st (nil:
// none) and of prev (nil: none). When st is set, services come from the
// cache's snapshot at rev of epoch ep, and each part built is kept in st
// for the next body of any feed.
func newBody(services [][]*registryv1.Instance, prev *snapshotBody, st *store, ep string, rev int64) (*snapshotBody, error) {
	b := &snapshotBody{parts: make([]*bodyPart, 0, len(services))}
	k := 0 // prev.parts before k are behind the current service
	for _, insts := range services {
		if len(insts) == 0 {
			continue
		}
		svc := insts[0].Service
		var (
			srcs [2]*bodyPart
			pend func(*registryv1.Instance) []byte
		)
		if st != nil {
			srcs[0], pend = st.sources(svc)
		}
		if prev != nil {
			// Both are sorted by service: advance to this one's part.
			for k < len(prev.parts) && prev.parts[k].insts[0].Service < svc {
				k++
			}
			if k < len(prev.parts) && prev.parts[k].insts[0].Service == svc {
				srcs[1] = prev.parts[k]
			}
		}
		p, err := newPart(insts, srcs[:], pend)
		if err != nil {
			return nil, err
		}
		if st != nil && p != srcs[0] {
			st.keep(svc, p, ep, rev)
		}
		b.parts = append(b.parts, p)
		b.n += len(insts)
	}
	return b, nil
}

// newPart encodes insts, all of one service and sorted by id, taking each
// element from the first of srcs (parts of the same service, sorted by
// id; nil entries are skipped) that holds the very same *Instance, else
// from pend (nil: none), else encoding it. A source that holds exactly
// insts is returned as it is.
func newPart(insts []*registryv1.Instance, srcs []*bodyPart, pend func(*registryv1.Instance) []byte) (*bodyPart, error) {
	for _, src := range srcs {
		if src != nil && sameInstances(src.insts, insts) {
			return src, nil
		}
	}
	p := &bodyPart{insts: insts, elems: make([][]byte, len(insts))}
	var at [2]int // each source's cursor: both walk by id alongside insts
	cur := at[:0]
	for range srcs {
		cur = append(cur, 0)
	}
	for i, in := range insts {
		var e []byte
		for k, src := range srcs {
			if src == nil {
				continue
			}
			c := cur[k]
			for c < len(src.insts) && src.insts[c].Id < in.Id {
				c++
			}
			cur[k] = c
			if c < len(src.insts) && src.insts[c] == in {
				e = src.elems[c]
				break
			}
		}
		if e == nil && pend != nil {
			e = pend(in)
		}
		if e == nil {
			raw, err := proto.Marshal(in)
			if err != nil {
				return nil, fmt.Errorf("encode instance %s/%s: %w", in.GetService(), in.GetId(), err)
			}
			e = make([]byte, 0, chunk.Cost(len(raw)))
			e = protowire.AppendTag(e, fieldSnapInstances, protowire.BytesType)
			e = protowire.AppendBytes(e, raw)
		}
		p.elems[i] = e
	}
	return p, nil
}

// sameInstances reports whether a and b hold the same instances in the
// same order; when the cache shared the slice, at no cost.
func sameInstances(a, b []*registryv1.Instance) bool {
	if len(a) != len(b) {
		return false
	}
	if len(a) == 0 || &a[0] == &b[0] {
		return true
	}
	for i := range a {
		if a[i] != b[i] {
			return false
		}
	}
	return true
}

// each calls f with every element, in snapshot order.
func (sb *snapshotBody) each(f func(e []byte)) {
	for _, p := range sb.parts {
		for _, e := range p.elems {
			f(e)
		}
	}
}

// chunks frames the body as WatchResponse snapshot chunks of at most
// maxBytes each (an element larger than that alone goes alone), always at
// least one, the last with more=false.
func (sb *snapshotBody) chunks(b cache.Batch, maxBytes int) [][]byte {
	k := kindFrame{field: fieldWatchSnapshot, more: fieldSnapMore,
		flags: []flagField{{fieldSnapReset, b.Reset}, {fieldSnapNewEpoch, b.NewEpoch}}}
	return frameChunks(b, k, sb.each, maxBytes)
}

// kindFrame is how a unit of one kind is framed: the WatchResponse field
// that holds it, and the bool fields written after its elements, in field
// order (more last, set on every chunk but the last).
type kindFrame struct {
	field protowire.Number
	flags []flagField
	more  protowire.Number
}

type flagField struct {
	num protowire.Number
	on  bool
}

// frameChunks frames the elements each yields (each one a field 1 of the
// kind's message: tag, length, bytes) as chunks of at most maxBytes each
// (an element larger than that alone goes alone), always at least one.
func frameChunks(b cache.Batch, k kindFrame, each func(func([]byte)), maxBytes int) [][]byte {
	flagsAtMost := (len(k.flags) + 1) * boolFieldSize
	// Everything in a chunk but its elements and the length of the kind's
	// field: revision, epoch, the kind's tag and its flags.
	head := 0
	if b.Revision != 0 {
		head += 1 + protowire.SizeVarint(uint64(b.Revision))
	}
	if b.Epoch != "" {
		head += 1 + protowire.SizeBytes(len(b.Epoch))
	}
	head += 1 + flagsAtMost
	var (
		out   [][]byte
		cur   [][]byte // the elements of the chunk being filled
		used  int      // their size
		flush = func(more bool) {
			out = append(out, frame(b, k, cur, used, more))
			cur, used = cur[:0], 0
		}
	)
	each(func(e []byte) {
		inner := used + len(e) + flagsAtMost
		if len(cur) > 0 && head+protowire.SizeVarint(uint64(inner))+used+len(e) > maxBytes {
			flush(true)
		}
		cur = append(cur, e)
		used += len(e)
	})
	flush(false)
	return out
}

// frame writes one chunk of elems, of size used in all.
func frame(b cache.Batch, k kindFrame, elems [][]byte, used int, more bool) []byte {
	inner := used
	for _, f := range k.flags {
		if f.on {
			inner += boolFieldSize
		}
	}
	if more {
		inner += boolFieldSize
	}
	size := 1 + protowire.SizeVarint(uint64(inner)) + inner
	if b.Revision != 0 {
		size += 1 + protowire.SizeVarint(uint64(b.Revision))
	}
	if b.Epoch != "" {
		size += 1 + protowire.SizeBytes(len(b.Epoch))
	}
	w := make([]byte, 0, size)
	if b.Revision != 0 {
		w = protowire.AppendTag(w, fieldWatchRevision, protowire.VarintType)
		w = protowire.AppendVarint(w, uint64(b.Revision))
	}
	w = protowire.AppendTag(w, k.field, protowire.BytesType)
	w = protowire.AppendVarint(w, uint64(inner))
	for _, e := range elems {
		w = append(w, e...)
	}
	for _, f := range append(k.flags, flagField{k.more, more}) {
		if f.on {
			w = protowire.AppendTag(w, f.num, protowire.VarintType)
			w = protowire.AppendVarint(w, 1)
		}
	}
	if b.Epoch != "" {
		w = protowire.AppendTag(w, fieldWatchEpoch, protowire.BytesType)
		w = protowire.AppendString(w, b.Epoch)
	}
	return w
}
