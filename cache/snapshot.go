package cache

import (
	"slices"
	"strings"

	registryv1 "github.com/regcluster/registry/proto/registry/v1"
)

// Snapshot is one immutable view of the registry at one revision. It never
// changes after the Cache publishes it, so it may be read from any number
// of goroutines without locking, and held for as long as a caller needs a
// consistent view across several reads.
//
// The slices and instances it returns are shared with the cache and with
// other readers: callers must not modify them.
type Snapshot struct {
	revision int64
	// services maps each service to its instances sorted by id; it never
	// holds an empty slice. Shared with later snapshots until a batch
	// touches the service.
	services map[string][]*registryv1.Instance
	names    []string // the keys of services, sorted
	n        int      // total instances
}

// emptySnapshot is the view of a new cache: no instance, revision 0.
var emptySnapshot = &Snapshot{}

// Revision is the etcd revision this view was current at.
func (s *Snapshot) Revision() int64 { return s.revision }

// Instances returns service's instances sorted by id, nil if it has none.
// It takes no lock and allocates nothing: the slice is the snapshot's own,
// shared with every reader, and callers must not modify it or its
// instances.
func (s *Snapshot) Instances(service string) []*registryv1.Instance {
	return s.services[service]
}

// Get returns the instance service/id, and whether it exists. It takes no
// lock and allocates nothing; the instance must not be modified.
func (s *Snapshot) Get(service, id string) (*registryv1.Instance, bool) {
	list := s.services[service]
	i, ok := slices.BinarySearchFunc(list, id, compareID)
	if !ok {
		return nil, false
	}
	return list[i], true
}

// Services returns the names of the services that have at least one
// instance, sorted. The slice is a fresh copy the caller owns.
func (s *Snapshot) Services() []string { return slices.Clone(s.names) }

// All returns every instance sorted by (service, id), in a fresh slice the
// caller owns; the instances themselves are shared and must not be
// modified.
func (s *Snapshot) All() []*registryv1.Instance {
	all := make([]*registryv1.Instance, 0, s.n)
	for _, name := range s.names {
		all = append(all, s.services[name]...)
	}
	return all
}

// Len returns the number of instances in the view.
func (s *Snapshot) Len() int { return s.n }

func compareID(in *registryv1.Instance, id string) int { return strings.Compare(in.Id, id) }
