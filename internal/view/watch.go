package view

import (
	registryv1 "github.com/regcluster/registry/proto/registry/v1"
)

// Watch line types.
const (
	WatchSnapshot = "snapshot"
	WatchPut      = "put"
	WatchDelete   = "delete"
	WatchProgress = "progress"
)

// WatchLine is one line of `regctl watch -o json`:
//
//	{"type":"snapshot","revision":R,"reset":B,"instances":[...]}
//	{"type":"put","revision":R,"instance":{...}}
//	{"type":"delete","revision":R,"service":S,"id":I}
//	{"type":"progress","revision":R}
//
// Only the fields of its type are set; the others are left out.
type WatchLine struct {
	Type     string `json:"type"`
	Revision int64  `json:"revision"`
	// Reset and Instances are set on snapshots only. Reset is always
	// present on a snapshot, so it is a pointer.
	Reset     *bool      `json:"reset,omitempty"`
	Instances []Instance `json:"instances,omitzero"`
	// NewEpoch is set (true) on a reset snapshot after etcd was restored
	// or replaced: the one case where the revision may go down.
	NewEpoch bool `json:"new_epoch,omitzero"`
	// Instance is set on puts only.
	Instance *Instance `json:"instance,omitempty"`
	// Service and ID are set on deletes only.
	Service string `json:"service,omitempty"`
	ID      string `json:"id,omitempty"`
}

// NewWatchLines converts one WatchResponse to the lines it prints: one for
// a snapshot or a progress notification, one per event for a batch of
// events (all at the response's revision). A snapshot with no instances
// carries "instances":[]; an unknown kind gives no line.
//
// A snapshot may arrive in chunks (Snapshot.more): join the chunks' instances
// into the last chunk before converting, so that a snapshot is one line.
func NewWatchLines(r *registryv1.WatchResponse) []WatchLine {
	rev := r.GetRevision()
	switch k := r.GetKind().(type) {
	case *registryv1.WatchResponse_Snapshot:
		reset := k.Snapshot.GetReset_()
		insts := NewInstances(k.Snapshot.GetInstances())
		line := WatchLine{Type: WatchSnapshot, Revision: rev, Reset: &reset, Instances: insts, NewEpoch: k.Snapshot.GetNewEpoch()}
		return []WatchLine{line}
	case *registryv1.WatchResponse_Events:
		out := make([]WatchLine, 0, len(k.Events.GetEvents()))
		for _, ev := range k.Events.GetEvents() {
			switch ev.GetType() {
			case registryv1.Event_TYPE_PUT:
				inst := NewInstance(ev.GetInstance())
				out = append(out, WatchLine{Type: WatchPut, Revision: rev, Instance: &inst})
			case registryv1.Event_TYPE_DELETE:
				service, id := ev.GetService(), ev.GetId()
				if service == "" {
					service, id = ev.GetInstance().GetService(), ev.GetInstance().GetId()
				}
				out = append(out, WatchLine{Type: WatchDelete, Revision: rev, Service: service, ID: id})
			}
		}
		return out
	case *registryv1.WatchResponse_Progress:
		return []WatchLine{{Type: WatchProgress, Revision: rev}}
	}
	return nil
}
