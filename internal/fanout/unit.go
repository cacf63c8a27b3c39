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
	evs := make([]*registryv1.Event, len(u.b.Events))
	for i, e := range u.b.Events {
		if e.Type == cache.Put {
			evs[i] = &registryv1.Event{Type: registryv1.Event_TYPE_PUT, Instance: e.Instance, Service: e.Service, Id: e.ID}
		} else {
			evs[i] = &registryv1.Event{Type: registryv1.Event_TYPE_DELETE, Service: e.Service, Id: e.ID}
		}
	}
	unit := &registryv1.WatchResponse{Revision: u.b.Revision, Epoch: u.b.Epoch,
		Kind: &registryv1.WatchResponse_Events{Events: &registryv1.Events{Events: evs}}}
	var out [][]byte
	err := chunk.Split(unit, maxBytes, func(r *registryv1.WatchResponse) error {
		b, err := proto.Marshal(r)
		out = append(out, b)
		return err
	})
	if err != nil {
		return nil, fmt.Errorf("encode events at revision %d: %w", u.b.Revision, err)
	}
	return out, nil
}

// Field numbers of the messages snapshotBody writes by hand; a test checks
// its output against proto.Unmarshal.
const (
	fieldWatchRevision  = 1
	fieldWatchSnapshot  = 2
	fieldWatchEpoch     = 5
	fieldSnapInstances  = 1
	fieldSnapReset      = 2
	fieldSnapNewEpoch   = 3
	fieldSnapMore       = 4
	boolFieldSize       = 2 // a tag under 16 and one byte
	snapshotFlagsAtMost = 3 * boolFieldSize
)

// snapshotBody is the instances of one snapshot, each already encoded as
// an element of Snapshot.instances (tag, length, the Instance's bytes), in
// snapshot order: one part per service. A part is reused whole from the
// previous body of the same feed when the cache still holds the service
// unchanged (the cache shares a service's slice between its snapshots
// until a batch touches it), and element by element otherwise (the cache
// shares the *Instance of an unchanged record), so a snapshot costs one
// encoding per changed instance, not one per instance, and its chunks are
// copies of stored bytes.
type snapshotBody struct {
	parts []*bodyPart
	n     int // instances in all
}

// bodyPart is the encoded instances of one service.
type bodyPart struct {
	insts []*registryv1.Instance
	elems [][]byte
}

// newBody encodes the instances of services (one slice per service, in
// snapshot order), reusing what prev (nil: none) already encoded.
func newBody(services [][]*registryv1.Instance, prev *snapshotBody) (*snapshotBody, error) {
	b := &snapshotBody{parts: make([]*bodyPart, 0, len(services))}
	k := 0 // prev.parts before k are behind the current service
	for _, insts := range services {
		if len(insts) == 0 {
			continue
		}
		var old *bodyPart
		if prev != nil {
			// Both are sorted by service: advance to this one's part.
			for k < len(prev.parts) && prev.parts[k].insts[0].Service < insts[0].Service {
				k++
			}
			if k < len(prev.parts) && prev.parts[k].insts[0].Service == insts[0].Service {
				old = prev.parts[k]
			}
		}
		p, err := newPart(insts, old)
		if err != nil {
			return nil, err
		}
		b.parts = append(b.parts, p)
		b.n += len(insts)
	}
	return b, nil
}

// newPart encodes insts, all of one service, reusing old's elements.
func newPart(insts []*registryv1.Instance, old *bodyPart) (*bodyPart, error) {
	if old != nil && sameInstances(old.insts, insts) {
		return old, nil
	}
	var reuse map[*registryv1.Instance][]byte
	if old != nil {
		reuse = make(map[*registryv1.Instance][]byte, len(old.insts))
		for i, in := range old.insts {
			reuse[in] = old.elems[i]
		}
	}
	p := &bodyPart{insts: insts, elems: make([][]byte, len(insts))}
	for i, in := range insts {
		if e, ok := reuse[in]; ok {
			p.elems[i] = e
			continue
		}
		raw, err := proto.Marshal(in)
		if err != nil {
			return nil, fmt.Errorf("encode instance %s/%s: %w", in.GetService(), in.GetId(), err)
		}
		e := make([]byte, 0, chunk.Cost(len(raw)))
		e = protowire.AppendTag(e, fieldSnapInstances, protowire.BytesType)
		p.elems[i] = protowire.AppendBytes(e, raw)
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
	// Everything in a chunk but its elements and the length of the
	// Snapshot field: revision, epoch, the Snapshot tag and its flags.
	head := 0
	if b.Revision != 0 {
		head += 1 + protowire.SizeVarint(uint64(b.Revision))
	}
	if b.Epoch != "" {
		head += 1 + protowire.SizeBytes(len(b.Epoch))
	}
	head += 1 + snapshotFlagsAtMost
	var (
		out   [][]byte
		cur   [][]byte // the elements of the chunk being filled
		used  int      // their size
		flush = func(more bool) {
			out = append(out, frame(b, cur, used, more))
			cur, used = cur[:0], 0
		}
	)
	sb.each(func(e []byte) {
		inner := used + len(e) + snapshotFlagsAtMost
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
func frame(b cache.Batch, elems [][]byte, used int, more bool) []byte {
	inner := used
	for _, f := range []bool{b.Reset, b.NewEpoch, more} {
		if f {
			inner += boolFieldSize
		}
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
	w = protowire.AppendTag(w, fieldWatchSnapshot, protowire.BytesType)
	w = protowire.AppendVarint(w, uint64(inner))
	for _, e := range elems {
		w = append(w, e...)
	}
	for _, f := range []struct {
		num protowire.Number
		on  bool
	}{{fieldSnapReset, b.Reset}, {fieldSnapNewEpoch, b.NewEpoch}, {fieldSnapMore, more}} {
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
