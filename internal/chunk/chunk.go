// Package chunk frames the Watch stream by bytes. A unit (a snapshot, or
// the events of one or more transactions brought to one revision) goes out
// as messages of at most MaxBytes each, all at the unit's revision and all
// but the last flagged more=true; the subscriber joins them back and
// applies the unit whole, so it never shows half a snapshot or half a
// transaction. With records of at most record.MaxRecordSize (16 KiB), no
// message exceeds MaxBytes whatever the number of records, so a client's
// receive limit of RecvLimit always holds.
package chunk

import (
	"errors"
	"fmt"
	"slices"

	"google.golang.org/protobuf/encoding/protowire"
	"google.golang.org/protobuf/proto"

	registryv1 "github.com/regcluster/registry/proto/registry/v1"
)

// MaxBytes bounds the encoded size of one chunk (of a List page too).
const MaxBytes = 1 << 20

// RecvLimit is the receive limit clients set: four times the largest
// chunk, so a regnode that frames a little differently (an older or newer
// one) still fits.
const RecvLimit = 4 * MaxBytes

// ErrFraming is wrapped by Joiner.Add's error when a stream breaks the
// framing (a chunk of another kind, revision or epoch inside a unit).
var ErrFraming = errors.New("watch stream framing broken")

// Cost is what one element of encoded size n adds to a repeated field.
func Cost(n int) int { return 1 + protowire.SizeVarint(uint64(n)) + n }

// Split sends unit, a WatchResponse holding a whole snapshot or a whole
// events unit (any other kind is sent as it is), as chunks of at most
// maxBytes each. A chunk holds at least one element, so an element larger
// than maxBytes alone goes out alone. Split never modifies unit or the
// slices it holds.
func Split(unit *registryv1.WatchResponse, maxBytes int, send func(*registryv1.WatchResponse) error) error {
	switch k := unit.GetKind().(type) {
	case *registryv1.WatchResponse_Snapshot:
		snap := k.Snapshot
		mk := func(insts []*registryv1.Instance, more bool) *registryv1.WatchResponse {
			return &registryv1.WatchResponse{Revision: unit.Revision, Epoch: unit.Epoch, Kind: &registryv1.WatchResponse_Snapshot{
				Snapshot: &registryv1.Snapshot{Instances: insts, Reset_: snap.Reset_, NewEpoch: snap.NewEpoch, More: more}}}
		}
		return split(snap.Instances, proto.Size(mk(nil, true)), maxBytes, func(part []*registryv1.Instance, more bool) error {
			return send(mk(part, more))
		})
	case *registryv1.WatchResponse_Events:
		mk := func(evs []*registryv1.Event, more bool) *registryv1.WatchResponse {
			return &registryv1.WatchResponse{Revision: unit.Revision, Epoch: unit.Epoch, Kind: &registryv1.WatchResponse_Events{
				Events: &registryv1.Events{Events: evs, More: more}}}
		}
		return split(k.Events.Events, proto.Size(mk(nil, true)), maxBytes, func(part []*registryv1.Event, more bool) error {
			return send(mk(part, more))
		})
	}
	return send(unit)
}

// split calls send with consecutive parts of elems whose cost, plus base
// and room for the nested lengths to grow, fits maxBytes; always at least
// one call, the last with more=false.
func split[T proto.Message](elems []T, base, maxBytes int, send func([]T, bool) error) error {
	// Two nested length prefixes (the oneof field and, for a snapshot or
	// events, their own) grow from 1 to at most 4 bytes each.
	budget := maxBytes - base - 6
	start, used := 0, 0
	for i, e := range elems {
		c := Cost(proto.Size(e))
		if i > start && used+c > budget {
			if err := send(elems[start:i:i], true); err != nil {
				return err
			}
			start, used = i, 0
		}
		used += c
	}
	return send(elems[start:len(elems):len(elems)], false)
}

// Joiner joins the chunks of a Watch stream back into units. One Joiner per
// stream; the zero value is ready.
type Joiner struct {
	pending *registryv1.WatchResponse
}

// Add takes the next message of the stream. It returns the whole unit when
// r completes one (r itself for a progress message or a one-chunk unit),
// nil while a unit is still open, and an error wrapping ErrFraming if r
// cannot belong to the open unit (the stream must then be dropped).
func (j *Joiner) Add(r *registryv1.WatchResponse) (*registryv1.WatchResponse, error) {
	p := j.pending
	switch k := r.GetKind().(type) {
	case *registryv1.WatchResponse_Snapshot:
		if p == nil {
			if !k.Snapshot.More {
				return r, nil
			}
			j.pending = &registryv1.WatchResponse{Revision: r.Revision, Epoch: r.Epoch, Kind: &registryv1.WatchResponse_Snapshot{
				Snapshot: &registryv1.Snapshot{Instances: slices.Clone(k.Snapshot.Instances), Reset_: k.Snapshot.Reset_, NewEpoch: k.Snapshot.NewEpoch, More: true}}}
			return nil, nil
		}
		ps, ok := p.Kind.(*registryv1.WatchResponse_Snapshot)
		if !ok || !same(p, r) || ps.Snapshot.Reset_ != k.Snapshot.Reset_ || ps.Snapshot.NewEpoch != k.Snapshot.NewEpoch {
			return nil, j.broken(r)
		}
		ps.Snapshot.Instances = append(ps.Snapshot.Instances, k.Snapshot.Instances...)
		if k.Snapshot.More {
			return nil, nil
		}
		ps.Snapshot.More, j.pending = false, nil
		return p, nil
	case *registryv1.WatchResponse_Events:
		if p == nil {
			if !k.Events.More {
				return r, nil
			}
			j.pending = &registryv1.WatchResponse{Revision: r.Revision, Epoch: r.Epoch, Kind: &registryv1.WatchResponse_Events{
				Events: &registryv1.Events{Events: slices.Clone(k.Events.Events), More: true}}}
			return nil, nil
		}
		pe, ok := p.Kind.(*registryv1.WatchResponse_Events)
		if !ok || !same(p, r) {
			return nil, j.broken(r)
		}
		pe.Events.Events = append(pe.Events.Events, k.Events.Events...)
		if k.Events.More {
			return nil, nil
		}
		pe.Events.More, j.pending = false, nil
		return p, nil
	}
	if p != nil {
		return nil, j.broken(r)
	}
	return r, nil
}

// Open reports whether a unit is partly received.
func (j *Joiner) Open() bool { return j.pending != nil }

func same(a, b *registryv1.WatchResponse) bool {
	return a.Revision == b.Revision && a.Epoch == b.Epoch
}

func (j *Joiner) broken(r *registryv1.WatchResponse) error {
	p := j.pending
	j.pending = nil
	return fmt.Errorf("%w: a %T at revision %d (epoch %q) inside a unit at revision %d (epoch %q)",
		ErrFraming, r.GetKind(), r.GetRevision(), r.GetEpoch(), p.GetRevision(), p.GetEpoch())
}
