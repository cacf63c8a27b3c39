package xds

import (
	"context"
	"sync"

	corev3 "github.com/envoyproxy/go-control-plane/envoy/config/core/v3"
	resourcev3 "github.com/envoyproxy/go-control-plane/pkg/resource/v3"
	"google.golang.org/grpc/peer"

	registryv1 "github.com/regcluster/registry/proto/registry/v1"
)

// Acknowledgements. A drain waits for xDS clients as for SDK subscribers
// (WaitApplied): an xDS client has applied revision R of service S once it
// acknowledged (ACK) a response that carried S's assignment built from
// the registry at R or later. The tracker follows every stream (two
// clients may share a node id, so streams are counted, not nodes): which
// services' assignments it asked for, which it was sent in each response
// (by nonce), and which revision of each it acknowledged. Each version of
// an assignment cache is mapped to the revision it was built from
// (versions), so what a response carried is known from its own version,
// never from the cache as it is when the ACK comes.

// stream is one xDS stream as the tracker follows it.
type stream struct {
	node    string // the node id
	agent   string // the user agent name
	peer    string // its address as this regnode sees it
	follows map[string]bool
	acked   map[string]int64 // service → revision acknowledged
	sent    map[string]sentResponse
	nacks   int
	lastErr string
}

// sentResponse is what one response (by nonce) carried.
type sentResponse struct {
	rev      int64
	services []string
}

// maxVersions bounds the version → revision map (the oldest go first);
// an ACK of a version older than that counts for nothing, which only
// makes a drain wait for that client's next ACK.
const maxVersions = 4096

// tracker holds the streams and the versions' revisions.
type tracker struct {
	mu       sync.Mutex
	streams  map[int64]*stream
	versions map[string]int64 // assignment version → revision it was built from
	order    []string         // versions in the order added, for pruning
	changed  chan struct{}    // closed (and replaced) when an ACK or a stream changes the answer
}

func newTracker() *tracker {
	return &tracker{streams: map[int64]*stream{}, versions: map[string]int64{}, changed: make(chan struct{})}
}

// notifyLocked wakes the waiters; t.mu is held.
func (t *tracker) notifyLocked() {
	close(t.changed)
	t.changed = make(chan struct{})
}

// version records that assignment version v was built from revision rev.
func (t *tracker) version(v string, rev int64) {
	t.mu.Lock()
	defer t.mu.Unlock()
	t.versions[v] = rev
	t.order = append(t.order, v)
	if len(t.order) > maxVersions {
		drop := len(t.order) - maxVersions
		for _, old := range t.order[:drop] {
			delete(t.versions, old)
		}
		t.order = append(t.order[:0:0], t.order[drop:]...)
	}
}

func (t *tracker) open(ctx context.Context, id int64) {
	addr := "unknown"
	if p, ok := peer.FromContext(ctx); ok && p.Addr != nil {
		addr = p.Addr.String()
	}
	t.mu.Lock()
	defer t.mu.Unlock()
	t.streams[id] = &stream{peer: addr, follows: map[string]bool{}, acked: map[string]int64{}, sent: map[string]sentResponse{}}
}

func (t *tracker) close(id int64) {
	t.mu.Lock()
	defer t.mu.Unlock()
	if s := t.streams[id]; s != nil && len(s.follows) > 0 {
		t.notifyLocked() // a client gone is no longer waited for
	}
	delete(t.streams, id)
}

// request takes one request of stream id: who it is, what assignments it
// follows, and what its ACK or NACK says of the response it answers.
// It reports a NACK's message ("" if none).
func (t *tracker) request(id int64, n *corev3.Node, typeURL, nonce string, nack *string, subscribe, unsubscribe []string, sotw bool) {
	t.mu.Lock()
	defer t.mu.Unlock()
	s := t.streams[id]
	if s == nil {
		return
	}
	if n != nil {
		s.node, s.agent = n.GetId(), n.GetUserAgentName()
	}
	if typeURL != resourcev3.EndpointType {
		return
	}
	before := len(s.follows)
	if sotw { // the full list, each time
		clear(s.follows)
	}
	for _, name := range subscribe {
		s.follows[name] = true
	}
	for _, name := range unsubscribe {
		delete(s.follows, name)
	}
	changed := len(s.follows) != before
	if r, ok := s.sent[nonce]; ok {
		delete(s.sent, nonce)
		if nack != nil {
			s.nacks++
			s.lastErr = *nack
		} else {
			for _, svc := range r.services {
				if r.rev > s.acked[svc] {
					s.acked[svc] = r.rev
					changed = true
				}
			}
		}
	}
	if changed {
		t.notifyLocked()
	}
}

// response notes the response of nonce on stream id: once its client
// acknowledges it, it holds every assignment it followed then as of the
// revision version maps to (a LinearCache response carries each followed
// resource the client does not have at that version, so an ACK says the
// client has them all).
func (t *tracker) response(id int64, typeURL, nonce, version string) {
	if typeURL != resourcev3.EndpointType {
		return
	}
	t.mu.Lock()
	defer t.mu.Unlock()
	s, rev := t.streams[id], t.versions[version]
	if s == nil || rev == 0 || len(s.follows) == 0 {
		return
	}
	services := make([]string, 0, len(s.follows))
	for svc := range s.follows {
		services = append(services, svc)
	}
	// A client answers each response before the next of its type; one
	// left unanswered (the stream moved on) is dropped with the next.
	clear(s.sent)
	s.sent[nonce] = sentResponse{rev: rev, services: services}
}

// Pending says how many of this regnode's xDS streams follow service's
// endpoints, which of them have not acknowledged rev (as laggards: node
// id, peer, revision acknowledged), and a channel closed when that may
// have changed.
func (t *tracker) Pending(service string, rev int64) (clients int, laggards []*registryv1.Laggard, changed <-chan struct{}) {
	t.mu.Lock()
	defer t.mu.Unlock()
	for _, s := range t.streams {
		if !s.follows[service] {
			continue
		}
		clients++
		if a := s.acked[service]; a < rev {
			laggards = append(laggards, &registryv1.Laggard{Subscriber: s.node, Peer: s.peer, Revision: a})
		}
	}
	return clients, laggards, t.changed
}
