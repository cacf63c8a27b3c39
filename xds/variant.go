package xds

import (
	"context"
	"fmt"
	"strings"
	"unicode"

	corev3 "github.com/envoyproxy/go-control-plane/envoy/config/core/v3"
	cachev3 "github.com/envoyproxy/go-control-plane/pkg/cache/v3"
	resourcev3 "github.com/envoyproxy/go-control-plane/pkg/resource/v3"
)

// kind is what a client does with what it is sent.
type kind string

const (
	// kindGRPC is proxyless gRPC in any language: it drops DEGRADED and
	// DRAINING endpoints, weighs localities and not endpoints.
	kindGRPC kind = "grpc"
	// kindEnvoy is Envoy: it keeps DEGRADED as a lower tier, weighs
	// endpoints, and routes by zone by itself.
	kindEnvoy kind = "envoy"
)

// variant is what decides a client's ClusterLoadAssignments: its kind and
// the zone its bootstrap names (gRPC only: Envoy applies its own).
type variant struct {
	kind kind
	zone string
}

func (v variant) String() string { return string(v.kind) + "|" + v.zone }

// maxZoneVariants bounds the zones that get a variant of their own: a
// client may name any zone, and each variant costs an assignment per
// service per change. Zones past it are served without zone preference.
const maxZoneVariants = 64

// classify is the variant of a client, by its node: Envoy says so in its
// user agent name; everything else is gRPC. A zone that is not a short
// printable name is ignored.
func classify(n *corev3.Node) variant {
	if strings.EqualFold(n.GetUserAgentName(), "envoy") {
		return variant{kind: kindEnvoy}
	}
	z := n.GetLocality().GetZone()
	if len(z) > 63 || strings.IndexFunc(z, func(r rune) bool { return !unicode.IsPrint(r) || r == '|' }) >= 0 {
		z = ""
	}
	return variant{kind: kindGRPC, zone: z}
}

// caches is the cache the go-control-plane server serves from: one
// LinearCache per type for what every client gets alike (listeners,
// routes), per client kind for clusters, and per variant for assignments (assignments, from
// the Server: made and filled when the first client of a variant asks).
type caches struct {
	listeners   *cachev3.LinearCache
	routes      *cachev3.LinearCache
	clusters    map[kind]*cachev3.LinearCache // the load balancing policies differ
	assignments func(variant) *cachev3.LinearCache
}

var _ cachev3.Cache = (*caches)(nil)

func newCaches(prefix string, assignments func(variant) *cachev3.LinearCache) *caches {
	opt := cachev3.WithVersionPrefix(prefix)
	return &caches{assignments: assignments,
		listeners: cachev3.NewLinearCache(resourcev3.ListenerType, opt),
		routes:    cachev3.NewLinearCache(resourcev3.RouteType, opt),
		clusters: map[kind]*cachev3.LinearCache{
			kindGRPC:  cachev3.NewLinearCache(resourcev3.ClusterType, opt),
			kindEnvoy: cachev3.NewLinearCache(resourcev3.ClusterType, opt)}}
}

func (c *caches) byType(typeURL string, n *corev3.Node) (cachev3.Cache, error) {
	switch typeURL {
	case resourcev3.ListenerType:
		return c.listeners, nil
	case resourcev3.RouteType:
		return c.routes, nil
	case resourcev3.ClusterType:
		return c.clusters[classify(n).kind], nil
	case resourcev3.EndpointType:
		return c.assignments(classify(n)), nil
	}
	return nil, fmt.Errorf("the registry serves no resources of type %q", typeURL)
}

// CreateWatch routes a state-of-the-world watch to its type's cache.
func (c *caches) CreateWatch(r *cachev3.Request, sub cachev3.Subscription, out chan cachev3.Response) (func(), error) {
	lc, err := c.byType(r.GetTypeUrl(), r.GetNode())
	if err != nil {
		return nil, err
	}
	return lc.CreateWatch(r, sub, out)
}

// CreateDeltaWatch routes an incremental watch to its type's cache.
func (c *caches) CreateDeltaWatch(r *cachev3.DeltaRequest, sub cachev3.Subscription, out chan cachev3.DeltaResponse) (func(), error) {
	lc, err := c.byType(r.GetTypeUrl(), r.GetNode())
	if err != nil {
		return nil, err
	}
	return lc.CreateDeltaWatch(r, sub, out)
}

// Fetch is REST xDS, which regnode does not serve.
func (c *caches) Fetch(context.Context, *cachev3.Request) (cachev3.Response, error) {
	return nil, fmt.Errorf("the registry serves xDS over ADS streams only")
}
