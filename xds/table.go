package xds

import (
	"fmt"
	"sync"

	"github.com/envoyproxy/go-control-plane/pkg/cache/types"
	cachev3 "github.com/envoyproxy/go-control-plane/pkg/cache/v3"
	"google.golang.org/protobuf/types/known/anypb"
)

// table is one type's resources as state-of-the-world streams are served
// them (sotw.go): one per type, per client kind for clusters, per variant
// for assignments. Each resource is encoded once per version, whatever
// the number of streams that receive it, and a change wakes only the
// streams that follow a changed resource (or every resource).
type table struct {
	typeURL string
	full    bool // every response carries every resource followed (LDS, CDS)

	mu        sync.Mutex
	version   string           // the version of the last update
	res       map[string]entry // by name
	followers map[string]map[*sotwSub]struct{}
	wildcard  map[*sotwSub]struct{}
}

// entry is one resource: its encoding and the version that last changed it.
type entry struct {
	any     *anypb.Any
	version string
}

// newTable is an empty table of typeURL at version.
func newTable(typeURL, version string) *table {
	return &table{typeURL: typeURL, version: version, full: cachev3.ResourceRequiresFullStateInSotw(typeURL),
		res: map[string]entry{}, followers: map[string]map[*sotwSub]struct{}{}, wildcard: map[*sotwSub]struct{}{}}
}

// update sets the resources of up, removes those of gone, and makes
// version the table's; every stream that follows one of them, or
// every resource, is woken. A resource that does not encode is left as
// it was, and reported.
func (t *table) update(version string, up map[string]types.Resource, gone []string) error {
	enc := make(map[string]*anypb.Any, len(up))
	var first error
	for name, r := range up {
		a, err := anypb.New(r)
		if err != nil {
			if first == nil {
				first = fmt.Errorf("xds: %s %q not encoded: %w", t.typeURL, name, err)
			}
			continue
		}
		enc[name] = a
	}
	var wake []*sotwSub
	t.mu.Lock()
	t.version = version
	for name, a := range enc {
		t.res[name] = entry{any: a, version: version}
		for sub := range t.followers[name] {
			wake = append(wake, sub)
		}
	}
	for _, name := range gone {
		if _, ok := t.res[name]; !ok {
			continue
		}
		delete(t.res, name)
		for sub := range t.followers[name] {
			wake = append(wake, sub)
		}
	}
	if len(enc) > 0 || len(gone) > 0 {
		for sub := range t.wildcard {
			wake = append(wake, sub)
		}
	}
	t.mu.Unlock()
	// Outside t.mu: a stream takes its own lock, then the table's.
	for _, sub := range wake {
		sub.st.changed()
	}
	return first
}

// follow makes sub follow names (every resource if wildcard) instead of
// what it followed before (was, wasWildcard).
func (t *table) follow(sub *sotwSub, was map[string]bool, wasWildcard bool, names map[string]bool, wildcard bool) {
	t.mu.Lock()
	defer t.mu.Unlock()
	if wasWildcard && !wildcard {
		delete(t.wildcard, sub)
	}
	if wildcard {
		t.wildcard[sub] = struct{}{}
	}
	for name := range was {
		if !names[name] {
			if f := t.followers[name]; f != nil {
				delete(f, sub)
				if len(f) == 0 {
					delete(t.followers, name)
				}
			}
		}
	}
	for name := range names {
		if !was[name] {
			f := t.followers[name]
			if f == nil {
				f = map[*sotwSub]struct{}{}
				t.followers[name] = f
			}
			f[sub] = struct{}{}
		}
	}
}

// moved reports whether the table changed since version.
func (t *table) moved(version string) bool {
	t.mu.Lock()
	defer t.mu.Unlock()
	return t.version != version
}

// answer is what sub is due, as of now: the resources to send and the
// table's version (also when nothing is due: ok is false). When
// something is due, sub.sent becomes what the client then has (its
// stream's mu is held). A response
// carries the followed resources that changed since sub last got them
// (and, for LDS and CDS, every followed resource, as the protocol
// requires: one left out reads as deleted); it is due when one changed
// or went, or when force (a request that knows no version of ours).
// As go-control-plane's LinearCache does, the removal of an EDS or RDS
// resource sends nothing (state of the world cannot say it for them).
func (t *table) answer(sub *sotwSub, force bool) (res []*anypb.Any, version string, ok bool) {
	t.mu.Lock()
	defer t.mu.Unlock()
	following := func(name string) bool { return sub.wildcard || sub.names[name] }
	changed, removed := false, false
	for name := range sub.sent {
		if _, ok := t.res[name]; !ok || !following(name) {
			removed = true
		}
	}
	var changes []string
	visit := func(name string, e entry) {
		if v, ok := sub.sent[name]; !ok || v != e.version {
			changed = true
			changes = append(changes, name)
		}
	}
	if sub.wildcard {
		for name, e := range t.res {
			visit(name, e)
		}
	} else {
		for name := range sub.names {
			if e, ok := t.res[name]; ok {
				visit(name, e)
			}
		}
	}
	switch {
	case !force && !changed && !removed:
		return nil, t.version, false
	case !t.full && !force && !changed:
		return nil, t.version, false
	}
	for name := range sub.sent {
		if _, ok := t.res[name]; !ok || !following(name) {
			delete(sub.sent, name)
		}
	}
	names := changes
	if t.full { // every followed resource there is
		names = names[:0]
		if sub.wildcard {
			for name := range t.res {
				names = append(names, name)
			}
		} else {
			for name := range sub.names {
				if _, ok := t.res[name]; ok {
					names = append(names, name)
				}
			}
		}
	}
	res = make([]*anypb.Any, 0, len(names))
	for _, name := range names {
		e := t.res[name]
		res = append(res, e.any)
		sub.sent[name] = e.version
	}
	return res, t.version, true
}
