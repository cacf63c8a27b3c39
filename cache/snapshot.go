package cache

import (
	"iter"
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
	// holds an empty list. A list is shared with later snapshots until a
	// batch changes the service, and then only its untouched nodes are.
	services map[string]*list
	names    []string // the keys of services, sorted
	n        int      // total instances
}

// emptySnapshot is the view of a new cache: no instance, revision 0.
var emptySnapshot = &Snapshot{}

// Revision is the etcd revision this view was current at.
func (s *Snapshot) Revision() int64 { return s.revision }

// Instances returns service's instances sorted by id, nil if it has none.
// It takes no lock. The slice is shared with every reader of this version
// of the service, and callers must not modify it or its instances: the
// first call after a batch changed a large service builds it (O(N), once),
// and every later call, from any goroutine, returns that same slice without
// allocating. A service no batch has changed keeps its slice from one
// snapshot to the next. Code that runs once per batch should use Count,
// Get or Each instead, which never build it.
func (s *Snapshot) Instances(service string) []*registryv1.Instance {
	return s.services[service].slice()
}

// Count returns the number of service's instances, 0 if it has none. It
// takes no lock and allocates nothing.
func (s *Snapshot) Count(service string) int { return s.services[service].len() }

// Each yields service's instances sorted by id, walking the snapshot's own
// structure: it takes no lock and never builds the flat slice Instances
// returns. The instances are shared and must not be modified.
func (s *Snapshot) Each(service string) iter.Seq[*registryv1.Instance] {
	return s.services[service].all()
}

// Get returns the instance service/id, and whether it exists. It takes no
// lock and allocates nothing; the instance must not be modified.
func (s *Snapshot) Get(service, id string) (*registryv1.Instance, bool) {
	return s.services[service].get(id)
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
		s.services[name].root.appendTo(&all)
	}
	return all
}

// Len returns the number of instances in the view.
func (s *Snapshot) Len() int { return s.n }

func compareID(in *registryv1.Instance, id string) int { return strings.Compare(in.Id, id) }
