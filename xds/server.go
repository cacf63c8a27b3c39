// Package xds serves the registry's view to every language over Envoy's
// xDS: the Aggregated Discovery Service, state of the world (what gRPC's
// xDS clients speak, gRFC A27; sotw.go) and incremental (what Envoy
// prefers; go-control-plane's server). For each service S it serves Listener S,
// RouteConfiguration S, Cluster S and ClusterLoadAssignment S, so that
// grpc.NewClient("xds:///S") in Go, Java, C++, Python or Node needs
// nothing but a bootstrap file.
//
// What it guarantees:
//   - It is fed by the regnode's fan-out (it reads the hub's cache each
//     time the hub moves; no etcd watch of its own); it builds at most once
//     per Config.Coalesce, at once after a quiet spell, a burst as one
//     version.
//   - What a client may call is what the SDK would route to (offer in
//     resources.go): routable instances, DEGRADED at reduced weight,
//     DRAINING sent as DRAINING until the instance leaves, UNAVAILABLE
//     and STARTING never, and the SDK's panic rule applied here.
//   - Registry weights hold in every gRPC language: each instance is a
//     locality weighted by its weight (gRPC weighs localities, not
//     endpoints). A client whose bootstrap names a zone prefers that
//     zone's instances by priority while one is usable.
//   - Each resource variant is encoded once per version however many
//     streams receive it (table.go; go-control-plane's LinearCache
//     memoizes it for delta streams), and versions carry a prefix random
//     to this process, so they never repeat across regnodes or restarts.
//   - A service that does not exist is absent from the answer (gRPC
//     clients then report it does not exist), never an error that ends
//     the stream.
//
// Why LinearCaches and not go-control-plane's SnapshotCache: with ADS, a
// SnapshotCache answers only once a client names every resource of the
// snapshot, so a gRPC client naming one service is never answered
// (grpc-go #5131); LinearCaches answer per resource.
//
// Why our own state-of-the-world server and not go-control-plane's: a
// gRPC client ACKs every response, and that server turns each ACK into a
// new cache watch (a channel hop to the stream's loop, a select over its
// watches, a LinearCache lock and watch maps), then builds and copies a
// response per stream; with a thousand streams on one service, that was
// about a quarter of the regnode's CPU per change (regbench propagate,
// profiled). sotw.go keeps, per stream and type, what
// the client was sent: an ACK is a map update, a change wakes only the
// streams that follow it. Delta streams (Envoy) stay on go-control-plane,
// whose delta server has no such cost per ACK worth owning the protocol
// for; both are fed by the same builds at the same versions.
package xds

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"errors"
	"fmt"
	"log/slog"
	"slices"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	corev3 "github.com/envoyproxy/go-control-plane/envoy/config/core/v3"
	discoverygrpc "github.com/envoyproxy/go-control-plane/envoy/service/discovery/v3"
	"github.com/envoyproxy/go-control-plane/pkg/cache/types"
	cachev3 "github.com/envoyproxy/go-control-plane/pkg/cache/v3"
	resourcev3 "github.com/envoyproxy/go-control-plane/pkg/resource/v3"
	"github.com/envoyproxy/go-control-plane/pkg/server/config"
	serverv3 "github.com/envoyproxy/go-control-plane/pkg/server/v3"
	"github.com/prometheus/client_golang/prometheus"
	"google.golang.org/grpc"

	"github.com/regcluster/registry/cache"
	"github.com/regcluster/registry/lastresort"
	registryv1 "github.com/regcluster/registry/proto/registry/v1"
)

// View is the regnode's in-memory view of every instance, as the Server
// follows it: ready once loaded, a channel closed at its next change,
// and its current snapshot (the regnode's fan-out hub is one).
type View interface {
	Ready() <-chan struct{}
	Changed() <-chan struct{}
	Snapshot() *cache.Snapshot
}

// Config configures a Server. Zero fields take DefaultConfig's values.
type Config struct {
	// Hub is the regnode's view: the Server follows every service
	// through it (required).
	Hub View
	// Coalesce is the least time between the starts of two builds
	// (default 20ms): a change after a quiet spell is built at once, a
	// burst's changes wait for the window's end and go out as one
	// version.
	Coalesce time.Duration
	// PanicThresholdPercent: below this share of routable instances
	// (of those neither draining nor starting) every such instance is
	// offered, as the SDK's panic mode does (default 50; the SDK's).
	PanicThresholdPercent int
	// Logger (nil: slog.Default()).
	Logger *slog.Logger
	// Registerer receives the Server's metrics (nil: none).
	Registerer prometheus.Registerer
	// LastResort says when and for how long the instances of a service
	// that mostly vanished by lease expiry are still offered, while
	// nothing else is routable (package lastresort; zero fields take its
	// defaults; OnStart and OnEnd are the Server's own: logged and
	// counted).
	LastResort lastresort.Config
	// Scope, if set, says what the client of an xDS stream may read (ctx
	// is the stream's): every service, or those canRead allows; the
	// others are never served to it (scope.go). Nil: every service.
	Scope func(ctx context.Context) (all bool, canRead func(service string) bool)
}

// DefaultConfig is the Config a zero one runs with.
func DefaultConfig() Config {
	return Config{Coalesce: 20 * time.Millisecond, PanicThresholdPercent: 50}
}

// Validate reports a Config that cannot work: no Hub, a negative
// Coalesce, a panic threshold outside 0..100.
func (c Config) Validate() error {
	switch {
	case c.Hub == nil:
		return errors.New("xds: Config.Hub is required")
	case c.Coalesce < 0:
		return fmt.Errorf("xds: Config.Coalesce must be >= 0, got %s", c.Coalesce)
	case c.PanicThresholdPercent < 0 || c.PanicThresholdPercent > 100:
		return fmt.Errorf("xds: Config.PanicThresholdPercent must be 0..100, got %d", c.PanicThresholdPercent)
	}
	return nil
}

func (c Config) withDefaults() Config {
	d := DefaultConfig()
	if c.Coalesce == 0 {
		c.Coalesce = d.Coalesce
	}
	if c.PanicThresholdPercent == 0 {
		c.PanicThresholdPercent = d.PanicThresholdPercent
	}
	if c.Logger == nil {
		c.Logger = slog.Default()
	}
	return c
}

// Server serves ADS from the regnode's view. Register it on a gRPC
// server, and Run it for as long as it serves.
type Server struct {
	cfg    Config
	log    *slog.Logger
	lr     *lastresort.Tracker
	caches *caches
	ads    serverv3.Server // delta streams (sotw.go serves the others)
	cb     serverv3.Callbacks
	m      *metrics
	ctx    context.Context // the xDS streams' life: ends when Run returns
	cancel context.CancelFunc

	prefix string // versions' prefix: random to this process

	acks    *tracker     // the streams and what they acknowledged (acks.go)
	scopes  *scopes      // what each stream may read (scope.go)
	sotwIDs atomic.Int64 // the last state-of-the-world stream's id

	// The state-of-the-world streams' tables of what every client gets
	// alike (sotw.go); a variant's assignments are in its assignCache.
	listeners, routes *table
	clusters          map[kind]*table

	// mu serializes builds and guards what they read and write.
	mu       sync.Mutex
	built    map[string]*built // by service: what the caches hold
	rev      int64             // the revision of the last build
	variants map[variant]*assignCache
	zones    int    // variants with a zone
	shared   uint64 // the version of the shared tables, counted per update
}

// assignCache is one variant's assignments, with a version prefix of its
// own and its version counted as the LinearCache counts it (one per
// update), so each version it sends maps to the revision it was built
// from (acks.go). The LinearCache serves delta streams, the table the
// others, at the same versions.
type assignCache struct {
	*cachev3.LinearCache
	tbl     *table
	prefix  string
	version uint64
}

// built is one service as last served.
type built struct {
	insts  []*registryv1.Instance // the records it was built from (pointers compared)
	rev    int64                  // the revision of the build that made it
	offers []offered
	panic  bool
}

// New returns a Server of cfg; nothing runs until Run.
func New(cfg Config) (*Server, error) {
	if err := cfg.Validate(); err != nil {
		return nil, err
	}
	cfg = cfg.withDefaults()
	var nonce [6]byte
	if _, err := rand.Read(nonce[:]); err != nil {
		return nil, fmt.Errorf("xds: version prefix: %w", err)
	}
	s := &Server{cfg: cfg, log: cfg.Logger.With("component", "xds"), prefix: hex.EncodeToString(nonce[:]) + "-",
		built: map[string]*built{}, variants: map[variant]*assignCache{}, acks: newTracker(),
		scopes: &scopes{of: cfg.Scope, m: map[int64]scope{}}}
	s.m = newMetrics(cfg.Registerer, s.acks)
	lr := cfg.LastResort
	lr.OnStart = func(service string, kept []*registryv1.Instance, until time.Time) {
		s.m.lastResorts.Inc()
		s.log.Warn("most of a service vanished by lease expiry at once (not deregistered): its instances stay offered as a last resort while nothing else is routable",
			"service", service, "instances", len(kept), "until", until)
	}
	lr.OnEnd = func(service string, why lastresort.EndReason) {
		s.log.Info("last resort over", "service", service, "why", why.String())
	}
	var err error
	if s.lr, err = lastresort.New(lr); err != nil {
		return nil, fmt.Errorf("xds: %w", err)
	}
	s.caches = newCaches(s.prefix, func(v variant) *cachev3.LinearCache { return s.variant(v).LinearCache })
	s.listeners, s.routes = newTable(resourcev3.ListenerType, s.prefix+"0"), newTable(resourcev3.RouteType, s.prefix+"0")
	s.clusters = map[kind]*table{kindGRPC: newTable(resourcev3.ClusterType, s.prefix+"0"),
		kindEnvoy: newTable(resourcev3.ClusterType, s.prefix+"0")}
	s.ctx, s.cancel = context.WithCancel(context.Background())
	s.cb = s.callbacks()
	// An empty first subscription is a wildcard for listeners and
	// clusters only, as scopes (scope.go) and sotw.go read it: left on for
	// assignments and routes, it served a scoped client every service.
	s.ads = serverv3.NewServer(s.ctx, s.caches, s.cb,
		config.DeactivateLegacyWildcardForTypes([]string{resourcev3.EndpointType, resourcev3.RouteType}))
	return s, nil
}

// Register serves the Aggregated Discovery Service on g.
func (s *Server) Register(g *grpc.Server) {
	discoverygrpc.RegisterAggregatedDiscoveryServiceServer(g, &adsServer{AggregatedDiscoveryServiceServer: s.ads, s: s})
}

// Run follows the hub and serves each change until ctx ends; then every
// xDS stream ends. It reads the hub's cache as a whole each time the hub
// moves (it is no subscriber of the hub). Builds are at most one per
// Config.Coalesce: a change after a quiet spell is built at once, and the
// changes of a burst wait for the end of the window and are built as one
// version.
func (s *Server) Run(ctx context.Context) error {
	defer s.cancel()
	select {
	case <-s.cfg.Hub.Ready():
	case <-ctx.Done():
		return nil
	}
	t := time.NewTimer(0)
	<-t.C
	grace := time.NewTimer(time.Hour) // the next end of a last resort
	defer grace.Stop()
	var (
		last  *cache.Snapshot
		built time.Time
	)
	for {
		changed := s.cfg.Hub.Changed() // before the read: no change falls between
		if snap := s.cfg.Hub.Snapshot(); snap != last {
			// The window runs from the build's start: timed from its end,
			// every build's own cost was added to the next change's wait,
			// and under a steady rate near one change per window those
			// waits added up until they filled it.
			started := time.Now()
			s.rebuild(snap, nil)
			last, built = snap, started
		}
		if next := s.lr.Next(); !next.IsZero() {
			grace.Reset(max(0, time.Until(next)))
		}
		select {
		case <-ctx.Done():
			return nil
		case <-changed:
		case now := <-grace.C:
			if ended := s.lr.Expire(now); len(ended) > 0 {
				s.rebuild(last, ended)
			}
			continue
		}
		if wait := s.cfg.Coalesce - time.Since(built); wait > 0 {
			t.Reset(wait)
			select {
			case <-ctx.Done():
				t.Stop()
				return nil
			case <-t.C:
			}
		}
	}
}

// rebuild serves snap: every service whose records changed since the
// last build (or in again, whose last resort ended) gets new resources,
// every service gone loses them, unless its vanished instances are kept
// as a last resort (package lastresort): then they are offered, while
// nothing else of it is routable.
func (s *Server) rebuild(snap *cache.Snapshot, again []string) {
	s.mu.Lock()
	defer s.mu.Unlock()
	start := time.Now()
	// What was put and deleted between two builds (a deregistration's
	// DRAINING mark) tells a deliberate removal from a vanishing.
	var folded map[string][]*registryv1.Instance
	if ps, ok := s.cfg.Hub.(interface {
		PutsSince(int64) (map[string][]*registryv1.Instance, bool)
	}); ok && s.rev > 0 {
		folded, _ = ps.PutsSince(s.rev)
	}
	redo := map[string]bool{}
	for _, svc := range again {
		redo[svc] = true
	}
	shared := map[string]types.Resource{} // listeners... of new services
	var sharedGone []string
	changed := map[string]*built{}
	seen := map[string]bool{}
	build := func(svc string, insts []*registryv1.Instance) {
		old := s.built[svc]
		if old != nil && slices.Equal(old.insts, insts) && !redo[svc] {
			return
		}
		var prev []*registryv1.Instance
		if old != nil {
			prev = old.insts
		}
		s.lr.Observe(svc, lastresort.LastSeen(prev, folded[svc]), insts, start)
		offered := insts
		if kept := s.lr.Offer(svc, insts, start); len(kept) > 0 {
			offered = append(slices.Clone(insts), kept...)
			slices.SortFunc(offered, func(a, b *registryv1.Instance) int { return strings.Compare(a.Id, b.Id) })
		}
		if len(offered) == 0 && old != nil {
			s.panicChange(svc, old, nil)
			delete(s.built, svc)
			sharedGone = append(sharedGone, svc)
			return
		}
		b := &built{insts: insts, rev: snap.Revision()}
		b.offers, b.panic = offer(offered, s.cfg.PanicThresholdPercent)
		s.panicChange(svc, old, b)
		s.built[svc] = b
		changed[svc] = b
		if old == nil {
			shared[svc] = nil
		}
	}
	for _, svc := range snap.Services() {
		seen[svc] = true
		build(svc, snap.Instances(svc))
	}
	for svc := range s.built {
		if !seen[svc] {
			build(svc, nil) // gone: unless kept as a last resort
		}
	}
	if len(changed) == 0 && len(sharedGone) == 0 {
		return
	}
	s.updateShared(shared, sharedGone)
	s.rev = snap.Revision()
	for v, ac := range s.variants {
		up := make(map[string]types.Resource, len(changed))
		for svc, b := range changed {
			up[svc] = assignment(svc, b.offers, v)
		}
		// Mapped before the update: a response of it may go out at once.
		ac.version++
		version := ac.prefix + strconv.FormatUint(ac.version, 10)
		s.acks.version(version, s.rev, start)
		if err := ac.tbl.update(version, up, sharedGone); err != nil {
			s.log.Error("assignments not updated", "variant", v.String(), "err", err)
		}
		if err := ac.UpdateResources(up, sharedGone); err != nil {
			s.log.Error("assignments not updated", "variant", v.String(), "err", err)
		}
	}
	s.m.builds.Inc()
	s.m.buildSeconds.Observe(time.Since(start).Seconds())
}

// updateShared adds the listener, route and cluster of each new service
// and removes those of the services gone.
func (s *Server) updateShared(added map[string]types.Resource, gone []string) {
	ls, rs := map[string]types.Resource{}, map[string]types.Resource{}
	cg, ce := map[string]types.Resource{}, map[string]types.Resource{}
	for svc := range added {
		l, err := listener(svc)
		if err != nil {
			s.log.Error("listener not built", "service", svc, "err", err)
			continue
		}
		ls[svc], rs[svc], cg[svc], ce[svc] = l, route(svc), cluster(svc, kindGRPC), cluster(svc, kindEnvoy)
	}
	for _, u := range []struct {
		lc  *cachev3.LinearCache
		tbl *table
		res map[string]types.Resource
	}{{s.caches.listeners, s.listeners, ls}, {s.caches.routes, s.routes, rs},
		{s.caches.clusters[kindGRPC], s.clusters[kindGRPC], cg}, {s.caches.clusters[kindEnvoy], s.clusters[kindEnvoy], ce}} {
		if len(u.res) == 0 && len(gone) == 0 {
			continue
		}
		s.shared++
		if err := u.tbl.update(s.prefix+strconv.FormatUint(s.shared, 10), u.res, gone); err != nil {
			s.log.Error("resources not updated", "err", err)
		}
		if err := u.lc.UpdateResources(u.res, gone); err != nil {
			s.log.Error("resources not updated", "err", err)
		}
	}
}

// variant is the variant's ClusterLoadAssignments, made and filled with
// every service as last built when its first client asks: under mu, so
// no build falls between the fill and its first update.
func (s *Server) variant(v variant) *assignCache {
	s.mu.Lock()
	defer s.mu.Unlock()
	if ac := s.variants[v]; ac != nil {
		return ac
	}
	if v.zone != "" && s.zones >= maxZoneVariants {
		v.zone = ""
		if ac := s.variants[v]; ac != nil {
			return ac
		}
	}
	res := make(map[string]types.Resource, len(s.built))
	for svc, b := range s.built {
		res[svc] = assignment(svc, b.offers, v)
	}
	prefix := fmt.Sprintf("%s%d-", s.prefix, len(s.variants))
	ac := &assignCache{prefix: prefix, tbl: newTable(resourcev3.EndpointType, prefix+"0"),
		LinearCache: cachev3.NewLinearCache(resourcev3.EndpointType, cachev3.WithVersionPrefix(prefix), cachev3.WithInitialResources(res))}
	s.acks.version(prefix+"0", s.rev, time.Time{})
	if err := ac.tbl.update(prefix+"0", res, nil); err != nil {
		s.log.Error("assignments not encoded", "variant", v.String(), "err", err)
	}
	s.variants[v] = ac
	if v.zone != "" {
		s.zones++
	}
	s.m.variants.Inc()
	return ac
}

// table is the state-of-the-world table of typeURL for a client of node n.
func (s *Server) table(typeURL string, n *corev3.Node) (*table, error) {
	switch typeURL {
	case resourcev3.ListenerType:
		return s.listeners, nil
	case resourcev3.RouteType:
		return s.routes, nil
	case resourcev3.ClusterType:
		return s.clusters[classify(n).kind], nil
	case resourcev3.EndpointType:
		return s.variant(classify(n)).tbl, nil
	}
	return nil, fmt.Errorf("the registry serves no resources of type %q", typeURL)
}

// Revision is the registry revision an assignment version was built from
// (0 if the version is not one of the last few thousand this Server made):
// a version a client received tells how current its view is.
func (s *Server) Revision(version string) int64 {
	s.acks.mu.Lock()
	defer s.acks.mu.Unlock()
	return s.acks.versions[version].rev
}

// Pending says how many of this regnode's xDS clients follow service's
// endpoints, which have not acknowledged revision rev (as laggards: node
// id, address, revision acknowledged), and a channel closed when that
// may have changed. A drain waits on it (WaitApplied).
func (s *Server) Pending(service string, rev int64) (clients int, laggards []*registryv1.Laggard, changed <-chan struct{}) {
	return s.acks.Pending(service, rev)
}

// panicChange logs and counts a service entering or leaving panic.
func (s *Server) panicChange(svc string, old, now *built) {
	was, is := old != nil && old.panic, now != nil && now.panic
	switch {
	case is && !was:
		s.m.panics.Inc()
		s.m.panicking.Inc()
		s.log.Warn("panic: too few routable instances, xDS clients are offered every instance not draining or starting",
			"service", svc, "threshold_percent", s.cfg.PanicThresholdPercent)
	case was && !is:
		s.m.panicking.Dec()
		s.log.Info("panic over: enough routable instances", "service", svc)
	}
}

// wildcardType reports whether an empty subscription of typeURL is a
// wildcard (listeners and clusters: every one there is).
func wildcardType(typeURL string) bool {
	return typeURL == resourcev3.ListenerType || typeURL == resourcev3.ClusterType
}

// callbacks count streams, ACKs and NACKs, and log each NACK with the
// client's error (the client keeps its last good version).
func (s *Server) callbacks() serverv3.Callbacks {
	// Looked up once: every request and response counts.
	acks, requests, nacks := s.m.requests.WithLabelValues("ack"), s.m.requests.WithLabelValues("request"), s.m.requests.WithLabelValues("nack")
	sotwPushes, deltaPushes := s.m.pushes.WithLabelValues("sotw"), s.m.pushes.WithLabelValues("delta")
	nack := func(n *corev3.Node, typeURL, version, detail string) {
		nacks.Inc()
		s.log.Warn("an xDS client refused a version (NACK); it keeps its last good one",
			"node", n.GetId(), "user_agent", n.GetUserAgentName(), "type", typeURL, "version", version, "error", detail)
	}
	return serverv3.CallbackFuncs{
		StreamOpenFunc: func(ctx context.Context, id int64, _ string) error {
			s.m.streams.WithLabelValues("sotw").Inc()
			s.acks.open(ctx, id)
			s.scopes.open(ctx, id)
			return nil
		},
		StreamClosedFunc: func(id int64, _ *corev3.Node) {
			s.m.streams.WithLabelValues("sotw").Dec()
			s.acks.close(id)
			s.scopes.close(id)
		},
		DeltaStreamOpenFunc: func(ctx context.Context, id int64, _ string) error {
			s.m.streams.WithLabelValues("delta").Inc()
			s.acks.open(ctx, deltaKey(id))
			s.scopes.open(ctx, deltaKey(id))
			return nil
		},
		DeltaStreamClosedFunc: func(id int64, _ *corev3.Node) {
			s.m.streams.WithLabelValues("delta").Dec()
			s.acks.close(deltaKey(id))
			s.scopes.close(deltaKey(id))
		},
		StreamRequestFunc: func(id int64, r *discoverygrpc.DiscoveryRequest) error {
			// Cut to what the client may read before the caches see it
			// (the server builds the subscription after this callback).
			names, err := s.scopes.cut(id, r.GetTypeUrl(), r.GetResourceNames(), len(r.GetResourceNames()) == 0 && wildcardType(r.GetTypeUrl()))
			if err != nil {
				return err
			}
			r.ResourceNames = names
			var refused *string
			switch {
			case r.GetErrorDetail() != nil:
				msg := r.GetErrorDetail().GetMessage()
				refused = &msg
				nack(r.GetNode(), r.GetTypeUrl(), r.GetVersionInfo(), msg)
			case r.GetResponseNonce() != "":
				acks.Inc()
			default:
				requests.Inc()
			}
			s.acks.request(id, r.GetNode(), r.GetTypeUrl(), r.GetResponseNonce(), refused, r.GetResourceNames(), nil, true)
			return nil
		},
		StreamResponseFunc: func(_ context.Context, id int64, _ *discoverygrpc.DiscoveryRequest, r *discoverygrpc.DiscoveryResponse) {
			sotwPushes.Inc()
			s.acks.response(id, r.GetTypeUrl(), r.GetNonce(), r.GetVersionInfo())
		},
		StreamDeltaRequestFunc: func(id int64, r *discoverygrpc.DeltaDiscoveryRequest) error {
			first := r.GetResponseNonce() == "" && len(r.GetInitialResourceVersions()) == 0
			names, err := s.scopes.cut(deltaKey(id), r.GetTypeUrl(), r.GetResourceNamesSubscribe(),
				first && len(r.GetResourceNamesSubscribe()) == 0 && wildcardType(r.GetTypeUrl()))
			if err != nil {
				return err
			}
			r.ResourceNamesSubscribe = names
			var refused *string
			switch {
			case r.GetErrorDetail() != nil:
				msg := r.GetErrorDetail().GetMessage()
				refused = &msg
				nack(r.GetNode(), r.GetTypeUrl(), "", msg)
			case r.GetResponseNonce() != "":
				acks.Inc()
			default:
				requests.Inc()
			}
			s.acks.request(deltaKey(id), r.GetNode(), r.GetTypeUrl(), r.GetResponseNonce(), refused,
				r.GetResourceNamesSubscribe(), r.GetResourceNamesUnsubscribe(), false)
			return nil
		},
		StreamDeltaResponseFunc: func(id int64, _ *discoverygrpc.DeltaDiscoveryRequest, r *discoverygrpc.DeltaDiscoveryResponse) {
			deltaPushes.Inc()
			s.acks.response(deltaKey(id), r.GetTypeUrl(), r.GetNonce(), r.GetSystemVersionInfo())
		},
	}
}
