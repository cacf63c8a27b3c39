package render

import (
	"cmp"
	"fmt"
	"slices"
	"strconv"
	"strings"

	"github.com/regcluster/registry/cache"
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

// NewSnapshotLine is the line of a complete state at rev: the first line of
// a watch (reset false) and the line of every reset. Its instances are
// sorted by service and id, and encode as [] when there are none.
func NewSnapshotLine(rev int64, reset, newEpoch bool, insts []*registryv1.Instance) WatchLine {
	return WatchLine{Type: WatchSnapshot, Revision: rev, Reset: &reset, Instances: NewInstances(insts), NewEpoch: newEpoch}
}

// NewPutLine is the line of inst created or changed at rev.
func NewPutLine(rev int64, inst *registryv1.Instance) WatchLine {
	i := NewInstance(inst)
	return WatchLine{Type: WatchPut, Revision: rev, Instance: &i}
}

// NewDeleteLine is the line of service/id deleted at rev.
func NewDeleteLine(rev int64, service, id string) WatchLine {
	return WatchLine{Type: WatchDelete, Revision: rev, Service: service, ID: id}
}

// NewProgressLine is the line of a revision that moved with no change.
func NewProgressLine(rev int64) WatchLine {
	return WatchLine{Type: WatchProgress, Revision: rev}
}

// NewDiffLines converts what one batch changed to its lines, all at
// d.Revision: a put for every added or updated instance and a delete for
// every removed one, in (service, id) order. An empty diff gives no line.
func NewDiffLines(d cache.Diff) []WatchLine {
	out := make([]WatchLine, 0, len(d.Added)+len(d.Updated)+len(d.Removed))
	for _, in := range d.Added {
		out = append(out, NewPutLine(d.Revision, in))
	}
	for _, in := range d.Updated {
		out = append(out, NewPutLine(d.Revision, in))
	}
	for _, k := range d.Removed {
		out = append(out, NewDeleteLine(d.Revision, k.Service, k.ID))
	}
	slices.SortStableFunc(out, func(a, b WatchLine) int {
		as, ai := a.key()
		bs, bi := b.key()
		return cmp.Or(strings.Compare(as, bs), strings.Compare(ai, bi))
	})
	return out
}

// key is the (service, id) a put or delete line is about.
func (l WatchLine) key() (service, id string) {
	if l.Instance != nil {
		return l.Instance.Service, l.Instance.ID
	}
	return l.Service, l.ID
}

// NewWatchLines converts one WatchResponse to the lines it prints: one for
// a snapshot or a progress notification, one per event for a batch of
// events (all at the response's revision). A snapshot with no instances
// carries "instances":[]; an unknown kind gives no line.
//
// A snapshot or an events unit may arrive in chunks (Snapshot.more,
// Events.more): join a stream's chunks with chunk.Joiner and convert the
// whole units it returns, so that a snapshot is one line and a unit's lines
// are never printed half.
func NewWatchLines(r *registryv1.WatchResponse) []WatchLine {
	rev := r.GetRevision()
	switch k := r.GetKind().(type) {
	case *registryv1.WatchResponse_Snapshot:
		return []WatchLine{NewSnapshotLine(rev, k.Snapshot.GetReset_(), k.Snapshot.GetNewEpoch(), k.Snapshot.GetInstances())}
	case *registryv1.WatchResponse_Events:
		out := make([]WatchLine, 0, len(k.Events.GetEvents()))
		for _, ev := range k.Events.GetEvents() {
			switch ev.GetType() {
			case registryv1.Event_TYPE_PUT:
				out = append(out, NewPutLine(rev, ev.GetInstance()))
			case registryv1.Event_TYPE_DELETE:
				service, id := ev.GetService(), ev.GetId()
				if service == "" {
					service, id = ev.GetInstance().GetService(), ev.GetInstance().GetId()
				}
				out = append(out, NewDeleteLine(rev, service, id))
			}
		}
		return out
	case *registryv1.WatchResponse_Progress:
		return []WatchLine{NewProgressLine(rev)}
	}
	return nil
}

// Text is the line as `regctl watch` prints it in table form, without the
// newline:
//
//	REV 1234  SNAPSHOT  3 instances
//	REV 1239  RESET  3 instances
//	REV 12  RESET  *** NEW EPOCH: etcd was restored or replaced; revisions start over ***  3 instances
//	REV 1240  PUT  orders/o-1  10.0.0.1:80  SERVING  HEALTHY
//	REV 1241  DELETE  orders/o-1
//	REV 1250  PROGRESS
//
// A snapshot's line only counts its instances (see SnapshotMemberText).
// With wide, a put also shows zone=, weight=, version=, lease=, mod_rev=
// and, when set, reason= and metadata=.
func (l WatchLine) Text(wide bool) string {
	rev := "REV " + strconv.FormatInt(l.Revision, 10)
	switch l.Type {
	case WatchSnapshot:
		kind := "SNAPSHOT"
		if l.Reset != nil && *l.Reset || l.NewEpoch {
			kind = "RESET"
		}
		if l.NewEpoch {
			kind += "  *** NEW EPOCH: etcd was restored or replaced; revisions start over ***"
		}
		return fmt.Sprintf("%s  %s  %s", rev, kind, plural(len(l.Instances), "instance"))
	case WatchPut:
		var in Instance
		if l.Instance != nil {
			in = *l.Instance
		}
		return instanceText(rev, "PUT", in, wide)
	case WatchDelete:
		return fmt.Sprintf("%s  DELETE  %s/%s", rev, Cell(l.Service), Cell(l.ID))
	case WatchProgress:
		return rev + "  PROGRESS"
	}
	return fmt.Sprintf("%s  %s", rev, strings.ToUpper(Cell(l.Type)))
}

// SnapshotMemberText is the line `regctl watch` prints in table form for
// one instance of its first snapshot, after the snapshot's own line:
//
//	REV 1234  SNAPSHOT  orders/o-1  10.0.0.1:80  SERVING  HEALTHY
func SnapshotMemberText(rev int64, in Instance, wide bool) string {
	return instanceText("REV "+strconv.FormatInt(rev, 10), "SNAPSHOT", in, wide)
}

func instanceText(rev, verb string, in Instance, wide bool) string {
	s := fmt.Sprintf("%s  %s  %s/%s  %s  %s  %s", rev, verb, Cell(in.Service), Cell(in.ID), Cell(in.Address), Cell(in.Lifecycle), Cell(in.Health.State))
	if !wide {
		return s
	}
	s += fmt.Sprintf("  zone=%s weight=%d version=%s lease=%s mod_rev=%d", Cell(in.Zone), in.Weight, Cell(in.Version), Cell(in.LeaseID), in.ModRevision)
	if r := in.reason(); r != "" {
		s += " reason=" + strconv.Quote(r)
	}
	if len(in.Metadata) > 0 {
		s += " metadata=" + strconv.Quote(MetadataString(in.Metadata))
	}
	return s
}

func plural(n int, what string) string {
	if n == 1 {
		return "1 " + what
	}
	return strconv.Itoa(n) + " " + what + "s"
}
