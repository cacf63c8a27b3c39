package cache

import (
	registryv1 "github.com/regcluster/registry/proto/registry/v1"
)

// Diff is what one accepted batch changed: the net effect of the batch on
// the previous view. Applying Removed, Added and Updated to the previous
// Snapshot yields exactly the new one.
//
// Each list is sorted by (service, id) and a key appears in at most one
// list. Added holds keys absent before, Removed keys present before and
// absent now, Updated keys present before whose record changed; a key whose
// record is unchanged (the same mod revision within an epoch, or
// proto.Equal) is in no list. The instances are the cache's own shared
// records: callers must not modify them.
type Diff struct {
	// Revision is the cache's revision after the batch.
	Revision int64
	// Reset says the batch was a snapshot that replaced everything.
	// Subscribers should be told of it even when the diff is Empty.
	Reset bool

	Added, Updated []*registryv1.Instance
	Removed        []Key
}

// Empty reports whether the diff changes no instance. A progress batch,
// and a snapshot identical to the previous view, give an empty diff.
func (d Diff) Empty() bool {
	return len(d.Added) == 0 && len(d.Updated) == 0 && len(d.Removed) == 0
}
