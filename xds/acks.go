package xds

import (
	"cmp"
	"context"
	"maps"
	"slices"
	"strings"
	"sync"
	"time"

	corev3 "github.com/envoyproxy/go-control-plane/envoy/config/core/v3"
	resourcev3 "github.com/envoyproxy/go-control-plane/pkg/resource/v3"
	"github.com/prometheus/client_golang/prometheus"
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

// The tracker keys a stream by its id, negated for a delta stream
// (deltaKey): go-control-plane numbers state-of-the-world and delta
// streams with counters of their own, so the same id names one of each.
func deltaKey(id int64) int64 { return -id }

// stream is one xDS stream as the tracker follows it.
type stream struct {
	node     string // the node id
	agent    string // the user agent name
	peer     string // its address as this regnode sees it
	protocol string // "sotw" or "delta"
	opened   time.Time
	// followedAt is when it last began to follow a service: a response
	// of a version built before that answers its request, it is no push
	// of a change (registry_xds_push_seconds counts pushes only).
	followedAt time.Time
	follows    map[string]bool
	acked      map[string]int64 // service → revision acknowledged
	sent       map[string]sentResponse
	nacks      int
	lastErr    string
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
	versions map[string]versionOf // assignment version → the build that made it
	order    []string             // versions in the order added, for pruning
	changed  chan struct{}        // closed (and replaced) when an ACK or a stream changes the answer
	// push observes, per response carrying a version, the time since the
	// build that made it (registry_xds_push_seconds; nil: none).
	push prometheus.Observer
}

// versionOf is the build an assignment version came from: the registry
// revision it read and when it ran (zero: no change of the registry, as a
// variant's first version).
type versionOf struct {
	rev int64
	at  time.Time
}

func newTracker() *tracker {
	return &tracker{streams: map[int64]*stream{}, versions: map[string]versionOf{}, changed: make(chan struct{})}
}

// notifyLocked wakes the waiters; t.mu is held.
func (t *tracker) notifyLocked() {
	close(t.changed)
	t.changed = make(chan struct{})
}

// version records that assignment version v was built from revision rev
// by the build at time at.
func (t *tracker) version(v string, rev int64, at time.Time) {
	t.mu.Lock()
	defer t.mu.Unlock()
	t.versions[v] = versionOf{rev: rev, at: at}
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
	protocol := "sotw"
	if id < 0 { // deltaKey
		protocol = "delta"
	}
	t.mu.Lock()
	defer t.mu.Unlock()
	t.streams[id] = &stream{peer: addr, protocol: protocol, opened: time.Now(),
		follows: map[string]bool{}, acked: map[string]int64{}, sent: map[string]sentResponse{}}
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
	old := s.follows
	if sotw && !sameNames(s.follows, subscribe) { // the full list, each time (an ACK: the same one)
		old = maps.Clone(s.follows)
		clear(s.follows)
	}
	for _, name := range subscribe {
		if !old[name] {
			s.followedAt = time.Now()
		}
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

// sameNames reports whether names are the keys of set.
func sameNames(set map[string]bool, names []string) bool {
	if len(set) != len(names) {
		return false
	}
	for _, n := range names {
		if !set[n] {
			return false
		}
	}
	return true
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
	s, vo := t.streams[id], t.versions[version]
	if s == nil || vo.rev == 0 {
		return
	}
	if t.push != nil && !vo.at.IsZero() && vo.at.After(s.followedAt) {
		t.push.Observe(time.Since(vo.at).Seconds())
	}
	rev := vo.rev
	if len(s.follows) == 0 {
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

// ClientInfo is one xDS stream a Server serves, as Server.Clients
// reports it.
type ClientInfo struct {
	// StreamID is the stream's id on this Server, counted from its start
	// for each Protocol apart (a sotw and a delta stream may share one).
	StreamID int64
	// NodeID is the client's node id (its bootstrap's node.id; "" until
	// its first request names it).
	NodeID string
	// Kind is "grpc" or "envoy", from the user agent; "other" if neither.
	Kind string
	// UserAgent is the node's user_agent_name.
	UserAgent string
	// Peer is the client's address as this regnode sees it.
	Peer string
	// Protocol is "sotw" (state of the world) or "delta" (incremental).
	Protocol string
	// Services are the services whose endpoints it follows, by name.
	Services []FollowedService
	// NACKs counts the versions it refused; LastNACK is the error its
	// last NACK carried ("" if none).
	NACKs    int
	LastNACK string
	// Connected is when the stream opened.
	Connected time.Time
}

// FollowedService is one service an xDS stream follows.
type FollowedService struct {
	Service string
	// Acked is the revision of the last endpoints of it the client
	// acknowledged (0: none yet).
	Acked int64
	// Revision is the revision of the endpoints the Server serves for it
	// now: the last change of the service it built (0: no such service).
	// Acked < Revision: the client has not applied them yet.
	Revision int64
}

// kindOf is a client's kind from its user agent name: Envoy says
// "envoy", gRPC's xDS clients "gRPC <language>".
func kindOf(agent string) string {
	a := strings.ToLower(agent)
	switch {
	case strings.Contains(a, "envoy"):
		return "envoy"
	case strings.HasPrefix(a, "grpc"):
		return "grpc"
	}
	return "other"
}

// clientKinds are the kinds registry_xds_clients always reports.
var clientKinds = []string{"grpc", "envoy", "other"}

// clients is every stream, by id (Revision not filled).
func (t *tracker) clients() []ClientInfo {
	t.mu.Lock()
	defer t.mu.Unlock()
	out := make([]ClientInfo, 0, len(t.streams))
	for id, s := range t.streams {
		c := ClientInfo{StreamID: max(id, -id), NodeID: s.node, Kind: kindOf(s.agent), UserAgent: s.agent, Peer: s.peer,
			Protocol: s.protocol, NACKs: s.nacks, LastNACK: s.lastErr, Connected: s.opened,
			Services: make([]FollowedService, 0, len(s.follows))}
		for svc := range s.follows {
			c.Services = append(c.Services, FollowedService{Service: svc, Acked: s.acked[svc]})
		}
		slices.SortFunc(c.Services, func(a, b FollowedService) int { return strings.Compare(a.Service, b.Service) })
		out = append(out, c)
	}
	slices.SortFunc(out, func(a, b ClientInfo) int {
		return cmp.Or(strings.Compare(a.Protocol, b.Protocol), cmp.Compare(a.StreamID, b.StreamID))
	})
	return out
}

// kinds counts the streams by kind.
func (t *tracker) kinds() map[string]int {
	t.mu.Lock()
	defer t.mu.Unlock()
	n := map[string]int{}
	for _, s := range t.streams {
		n[kindOf(s.agent)]++
	}
	return n
}
