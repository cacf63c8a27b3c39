package xds

import (
	"net"
	"sort"
	"strconv"

	xdstypev3 "github.com/cncf/xds/go/xds/type/v3"
	clusterv3 "github.com/envoyproxy/go-control-plane/envoy/config/cluster/v3"
	corev3 "github.com/envoyproxy/go-control-plane/envoy/config/core/v3"
	endpointv3 "github.com/envoyproxy/go-control-plane/envoy/config/endpoint/v3"
	listenerv3 "github.com/envoyproxy/go-control-plane/envoy/config/listener/v3"
	routev3 "github.com/envoyproxy/go-control-plane/envoy/config/route/v3"
	routerv3 "github.com/envoyproxy/go-control-plane/envoy/extensions/filters/http/router/v3"
	hcmv3 "github.com/envoyproxy/go-control-plane/envoy/extensions/filters/network/http_connection_manager/v3"
	roundrobinv3 "github.com/envoyproxy/go-control-plane/envoy/extensions/load_balancing_policies/round_robin/v3"
	wrrlocalityv3 "github.com/envoyproxy/go-control-plane/envoy/extensions/load_balancing_policies/wrr_locality/v3"
	upstreamhttpv3 "github.com/envoyproxy/go-control-plane/envoy/extensions/upstreams/http/v3"
	typev3 "github.com/envoyproxy/go-control-plane/envoy/type/v3"
	"google.golang.org/protobuf/types/known/anypb"
	"google.golang.org/protobuf/types/known/structpb"
	"google.golang.org/protobuf/types/known/wrapperspb"

	"github.com/regcluster/registry/balance"
	registryv1 "github.com/regcluster/registry/proto/registry/v1"
	"github.com/regcluster/registry/record"
)

// The resources of service S are all named S: Listener S (an API listener
// whose HttpConnectionManager takes RouteConfiguration S over ADS, with the
// router filter last, as gRPC requires), RouteConfiguration S (every path
// to Cluster S), Cluster S (EDS over ADS) and ClusterLoadAssignment S.
// Only the ClusterLoadAssignment depends on who asks (variant.go).

// ads is the config source "over the ADS stream this came on".
func ads() *corev3.ConfigSource {
	return &corev3.ConfigSource{ResourceApiVersion: corev3.ApiVersion_V3,
		ConfigSourceSpecifier: &corev3.ConfigSource_Ads{Ads: &corev3.AggregatedConfigSource{}}}
}

// listener is Listener service.
func listener(service string) (*listenerv3.Listener, error) {
	router, err := anypb.New(&routerv3.Router{})
	if err != nil {
		return nil, err
	}
	hcm, err := anypb.New(&hcmv3.HttpConnectionManager{
		StatPrefix: service,
		RouteSpecifier: &hcmv3.HttpConnectionManager_Rds{Rds: &hcmv3.Rds{
			ConfigSource: ads(), RouteConfigName: service}},
		HttpFilters: []*hcmv3.HttpFilter{{Name: "envoy.filters.http.router",
			ConfigType: &hcmv3.HttpFilter_TypedConfig{TypedConfig: router}}},
	})
	if err != nil {
		return nil, err
	}
	return &listenerv3.Listener{Name: service, ApiListener: &listenerv3.ApiListener{ApiListener: hcm}}, nil
}

// route is RouteConfiguration service: every request to Cluster service.
func route(service string) *routev3.RouteConfiguration {
	return &routev3.RouteConfiguration{Name: service, VirtualHosts: []*routev3.VirtualHost{{
		Name: service, Domains: []string{"*"},
		Routes: []*routev3.Route{{
			Match:  &routev3.RouteMatch{PathSpecifier: &routev3.RouteMatch_Prefix{Prefix: ""}},
			Action: &routev3.Route_Route{Route: &routev3.RouteAction{ClusterSpecifier: &routev3.RouteAction_Cluster{Cluster: service}}},
		}},
	}}}
}

// h2 are the upstream protocol options that make Envoy speak HTTP/2 to
// the instances (registered instances are gRPC servers); gRPC clients
// ignore them.
var h2 = func() *anypb.Any {
	a, err := anypb.New(&upstreamhttpv3.HttpProtocolOptions{
		UpstreamProtocolOptions: &upstreamhttpv3.HttpProtocolOptions_ExplicitHttpConfig_{
			ExplicitHttpConfig: &upstreamhttpv3.HttpProtocolOptions_ExplicitHttpConfig{
				ProtocolConfig: &upstreamhttpv3.HttpProtocolOptions_ExplicitHttpConfig_Http2ProtocolOptions{
					Http2ProtocolOptions: &corev3.Http2ProtocolOptions{}}}}})
	if err != nil {
		panic(err) // a fixed message: it always marshals
	}
	return a
}()

// grpcPolicies is the load balancing policy list of gRPC clients'
// clusters (gRFC A52: a client takes the first it supports). First the
// SDK's own policy, registry_weighted (weighted P2C, ejection, slow
// start), which a Go client has when it links package balance; then
// gRPC's default, weighted localities with round robin inside, which
// every gRPC has: so a client that links the SDK gets its data plane,
// and any other still gets the registry's weights.
var grpcPolicies = func() *clusterv3.LoadBalancingPolicy {
	custom, err := anypb.New(&xdstypev3.TypedStruct{TypeUrl: "type.googleapis.com/" + balance.Name, Value: &structpb.Struct{}})
	if err != nil {
		panic(err) // fixed messages: they always marshal
	}
	rr, err := anypb.New(&roundrobinv3.RoundRobin{})
	if err != nil {
		panic(err)
	}
	wrr, err := anypb.New(&wrrlocalityv3.WrrLocality{EndpointPickingPolicy: &clusterv3.LoadBalancingPolicy{
		Policies: []*clusterv3.LoadBalancingPolicy_Policy{{TypedExtensionConfig: &corev3.TypedExtensionConfig{
			Name: "envoy.load_balancing_policies.round_robin", TypedConfig: rr}}}}})
	if err != nil {
		panic(err)
	}
	return &clusterv3.LoadBalancingPolicy{Policies: []*clusterv3.LoadBalancingPolicy_Policy{
		{TypedExtensionConfig: &corev3.TypedExtensionConfig{Name: balance.Name, TypedConfig: custom}},
		{TypedExtensionConfig: &corev3.TypedExtensionConfig{Name: "envoy.load_balancing_policies.wrr_locality", TypedConfig: wrr}},
	}}
}()

// cluster is Cluster service for clients of kind k: endpoints from EDS
// over ADS, round robin, HTTP/2 to the instances. Locality-weighted
// balancing is asked of Envoy (it then honours the locality weights that
// carry registry weights); gRPC clients get grpcPolicies.
func cluster(service string, k kind) *clusterv3.Cluster {
	c := clusterFor(service)
	if k == kindGRPC {
		c.LoadBalancingPolicy = grpcPolicies
	}
	return c
}

func clusterFor(service string) *clusterv3.Cluster {
	return &clusterv3.Cluster{
		TypedExtensionProtocolOptions: map[string]*anypb.Any{"envoy.extensions.upstreams.http.v3.HttpProtocolOptions": h2},
		Name:                          service,
		ClusterDiscoveryType:          &clusterv3.Cluster_Type{Type: clusterv3.Cluster_EDS},
		EdsClusterConfig:              &clusterv3.Cluster_EdsClusterConfig{EdsConfig: ads(), ServiceName: service},
		LbPolicy:                      clusterv3.Cluster_ROUND_ROBIN,
		CommonLbConfig: &clusterv3.Cluster_CommonLbConfig{
			LocalityConfigSpecifier: &clusterv3.Cluster_CommonLbConfig_LocalityWeightedLbConfig_{
				LocalityWeightedLbConfig: &clusterv3.Cluster_CommonLbConfig_LocalityWeightedLbConfig{}},
			// The registry applies its own panic rule (offer); Envoy's
			// would act on the statuses it is sent, a second time.
			HealthyPanicThreshold: &typev3.Percent{Value: 0},
		},
	}
}

// offered is one instance as a variant sends it.
type offered struct {
	in     *registryv1.Instance
	status corev3.HealthStatus
	weight uint32
}

// offer applies the registry's semantics to one service's instances,
// the same for every client: routable instances are usable (DEGRADED at
// reduced weight, record.EffectiveWeight); DRAINING ones are sent as
// DRAINING (clients stop new calls to them) until they leave the
// registry; UNAVAILABLE, never-probed-with-a-check and STARTING ones are
// not sent. The SDK's panic rule: when fewer than panicPercent of the
// non-draining, non-starting instances are routable, every one of them is
// offered (the prober can be wrong; calling them beats failing every
// call), and panic is true.
func offer(insts []*registryv1.Instance, panicPercent int) (out []offered, panic bool) {
	routable, candidates := 0, 0
	for _, in := range insts {
		switch in.GetLifecycle() {
		case registryv1.Lifecycle_LIFECYCLE_DRAINING, registryv1.Lifecycle_LIFECYCLE_STARTING:
			continue
		}
		candidates++
		if record.Routable(in) {
			routable++
		}
	}
	panic = panicPercent > 0 && candidates > 0 && routable*100 < panicPercent*candidates
	for _, in := range insts {
		o := offered{in: in, weight: record.EffectiveWeight(in)}
		switch {
		case in.GetLifecycle() == registryv1.Lifecycle_LIFECYCLE_DRAINING:
			o.status = corev3.HealthStatus_DRAINING
		case in.GetLifecycle() == registryv1.Lifecycle_LIFECYCLE_STARTING:
			continue
		case record.Routable(in) && in.GetHealth().GetState() == registryv1.HealthState_HEALTH_STATE_DEGRADED:
			o.status = corev3.HealthStatus_DEGRADED
		case record.Routable(in):
			o.status = corev3.HealthStatus_HEALTHY
		case panic:
			o.status = corev3.HealthStatus_HEALTHY // panic: offered as usable
		default:
			continue
		}
		out = append(out, o)
	}
	sort.Slice(out, func(i, j int) bool { return out[i].in.GetId() < out[j].in.GetId() })
	return out, panic
}

// lbEndpoint is one instance's LbEndpoint, with status and weight as the
// variant says; nil when its address is not host:port.
func lbEndpoint(o offered, status corev3.HealthStatus) *endpointv3.LbEndpoint {
	host, port, err := net.SplitHostPort(o.in.GetAddress())
	if err != nil {
		return nil
	}
	p, err := strconv.ParseUint(port, 10, 16)
	if err != nil {
		return nil
	}
	return &endpointv3.LbEndpoint{
		HostIdentifier: &endpointv3.LbEndpoint_Endpoint{Endpoint: &endpointv3.Endpoint{
			Address: &corev3.Address{Address: &corev3.Address_SocketAddress{SocketAddress: &corev3.SocketAddress{
				Address: host, PortSpecifier: &corev3.SocketAddress_PortValue{PortValue: uint32(p)}}}},
			Hostname: o.in.GetId(),
		}},
		HealthStatus:        status,
		LoadBalancingWeight: wrapperspb.UInt32(o.weight),
	}
}

// assignment is ClusterLoadAssignment service for variant v.
//
// For gRPC clients (any language) every instance is a locality of its
// own whose weight is the instance's: gRPC's round robin ignores endpoint
// weights but every gRPC implementation weighs localities (weighted_target),
// so shares follow registry weights. gRPC drops DEGRADED endpoints, so
// DEGRADED goes as HEALTHY at its reduced weight. With a zone, the zone's
// instances are priority 0 and the others priority 1 while the zone has a
// usable one (gRPC fails over by priority); without one, or when the zone
// has none, all are priority 0.
//
// For Envoy the localities are the zones, endpoints carry their weights
// and statuses (DEGRADED as DEGRADED: Envoy keeps it as a lower tier), and
// Envoy applies its own zone-aware routing.
func assignment(service string, offers []offered, v variant) *endpointv3.ClusterLoadAssignment {
	cla := &endpointv3.ClusterLoadAssignment{ClusterName: service}
	if v.kind == kindEnvoy {
		byZone := map[string]*endpointv3.LocalityLbEndpoints{}
		var zones []string
		for _, o := range offers {
			ep := lbEndpoint(o, o.status)
			if ep == nil {
				continue
			}
			z := o.in.GetZone()
			l := byZone[z]
			if l == nil {
				l = &endpointv3.LocalityLbEndpoints{Locality: &corev3.Locality{Zone: z}}
				byZone[z] = l
				zones = append(zones, z)
			}
			l.LbEndpoints = append(l.LbEndpoints, ep)
			w := uint32(0)
			if l.LoadBalancingWeight != nil {
				w = l.LoadBalancingWeight.Value
			}
			if o.status != corev3.HealthStatus_DRAINING {
				w += o.weight
			}
			l.LoadBalancingWeight = wrapperspb.UInt32(max(w, 1))
		}
		sort.Strings(zones)
		for _, z := range zones {
			cla.Endpoints = append(cla.Endpoints, byZone[z])
		}
		return cla
	}
	local := false
	for _, o := range offers {
		if v.zone != "" && o.in.GetZone() == v.zone && o.status != corev3.HealthStatus_DRAINING {
			local = true
		}
	}
	seen := map[string]bool{} // gRPC refuses an assignment that names an address twice
	for _, o := range offers {
		if seen[o.in.GetAddress()] {
			continue
		}
		seen[o.in.GetAddress()] = true
		status := o.status
		if status == corev3.HealthStatus_DEGRADED {
			status = corev3.HealthStatus_HEALTHY
		}
		ep := lbEndpoint(o, status)
		if ep == nil {
			continue
		}
		var prio uint32
		if local && o.in.GetZone() != v.zone {
			prio = 1
		}
		cla.Endpoints = append(cla.Endpoints, &endpointv3.LocalityLbEndpoints{
			Locality:            &corev3.Locality{Zone: o.in.GetZone(), SubZone: o.in.GetId()},
			LbEndpoints:         []*endpointv3.LbEndpoint{ep},
			LoadBalancingWeight: wrapperspb.UInt32(o.weight),
			Priority:            prio,
		})
	}
	return cla
}
