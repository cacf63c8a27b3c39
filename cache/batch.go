package cache

import (
	"strconv"

	registryv1 "github.com/regcluster/registry/proto/registry/v1"
)

// EventType is what happened to one instance key.
type EventType int

const (
	// Put created or replaced an instance; Event.Instance holds the new
	// record.
	Put EventType = iota + 1
	// Delete removed an instance (deleted, lease expired, or its record
	// became junk).
	Delete
)

// String returns "put", "delete", or "EventType(n)" for anything else.
func (t EventType) String() string {
	switch t {
	case Put:
		return "put"
	case Delete:
		return "delete"
	}
	return "EventType(" + strconv.Itoa(int(t)) + ")"
}

// Event is one change to one instance key.
//
// For Put, Instance is required and is the key's new record; Service and ID
// may be left empty, and if set must match Instance.Service and Instance.Id.
// For Delete, Service and ID name the key (if both are empty they are taken
// from Instance). An event that breaks these rules, or has another Type, is
// skipped and counted in Stats.Invalid: it never poisons the cache.
type Event struct {
	Type     EventType
	Service  string
	ID       string
	Instance *registryv1.Instance // for Put; never mutated after being handed to the cache
	// Encoded, for Put, may hold Instance in wire form as protobuf field 1
	// of wire type bytes (tag, length, the Instance's bytes: see
	// record.Element), for a consumer that forwards records without
	// encoding them again. A source sets it only to bytes that decode to
	// Instance; nil when it has none. The cache ignores it.
	Encoded []byte
}

// Batch is what a watcher delivers: an incremental batch of events, a
// progress notification, or a snapshot of everything.
type Batch struct {
	// Revision is the etcd revision after this batch.
	Revision int64
	// Snapshot says Instances is the complete state at Revision; it
	// replaces everything the cache holds.
	Snapshot bool
	// Reset, with Snapshot, says the source lost continuity (compaction, a
	// slow subscriber). It is informational: it is counted in Stats.Resets.
	Reset bool
	// NewEpoch, with Snapshot, says etcd was restored or replaced: the
	// revision may go DOWN, and mod revisions of the old epoch mean nothing
	// in the new one. It is the only case allowed to lower the revision.
	NewEpoch bool
	// Epoch names the etcd history a Snapshot was read from (see
	// internal/epoch), for sources that track it; the cache carries it
	// along and never interprets it.
	Epoch string
	// Instances is the complete state, for a Snapshot. Nil entries, and
	// entries without a service or id, are skipped and counted in
	// Stats.Invalid; if a key appears twice, the last one wins.
	Instances []*registryv1.Instance
	// Encoded, if not nil, is parallel to Instances (the same length):
	// Encoded[i] is Instances[i] in wire form, as Event.Encoded is, or nil
	// when the source has none for it. The cache ignores it.
	Encoded [][]byte
	// Events is an incremental batch (one etcd transaction, or several in
	// order), applied in order. Empty with !Snapshot means progress only.
	Events []Event
}

// Key names one instance.
type Key struct{ Service, ID string }

// keyOf returns the key ev changes and the key's record after it (nil for
// Delete), or ok=false for an invalid event.
func keyOf(ev Event) (k Key, inst *registryv1.Instance, ok bool) {
	switch ev.Type {
	case Put:
		in := ev.Instance
		if in == nil || (ev.Service != "" && ev.Service != in.Service) || (ev.ID != "" && ev.ID != in.Id) {
			return Key{}, nil, false
		}
		k, inst = Key{in.Service, in.Id}, in
	case Delete:
		k = Key{ev.Service, ev.ID}
		if k.Service == "" && k.ID == "" && ev.Instance != nil {
			k = Key{ev.Instance.Service, ev.Instance.Id}
		}
	default:
		return Key{}, nil, false
	}
	if k.Service == "" || k.ID == "" {
		return Key{}, nil, false
	}
	return k, inst, true
}
