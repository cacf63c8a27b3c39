package xds

import (
	"testing"

	corev3 "github.com/envoyproxy/go-control-plane/envoy/config/core/v3"
	upstreamhttpv3 "github.com/envoyproxy/go-control-plane/envoy/extensions/upstreams/http/v3"

	registryv1 "github.com/regcluster/registry/proto/registry/v1"
)

func inst(id, addr, zone string, w uint32, lc registryv1.Lifecycle, h registryv1.HealthState) *registryv1.Instance {
	return &registryv1.Instance{Service: "orders", Id: id, Address: addr, Zone: zone, Weight: w, Lifecycle: lc,
		Health: &registryv1.Health{State: h}, Check: &registryv1.HealthCheck{Kind: registryv1.CheckKind_CHECK_KIND_TCP}}
}

const (
	serving  = registryv1.Lifecycle_LIFECYCLE_SERVING
	draining = registryv1.Lifecycle_LIFECYCLE_DRAINING
	starting = registryv1.Lifecycle_LIFECYCLE_STARTING
	healthy  = registryv1.HealthState_HEALTH_STATE_HEALTHY
	degraded = registryv1.HealthState_HEALTH_STATE_DEGRADED
	unavail  = registryv1.HealthState_HEALTH_STATE_UNAVAILABLE
	unknown  = registryv1.HealthState_HEALTH_STATE_UNKNOWN
)

// The registry's semantics, the same for every client: routable usable,
// DEGRADED at a quarter of its weight, DRAINING sent as DRAINING,
// UNAVAILABLE, STARTING and never-probed-with-a-check not sent.
func TestOfferSemantics(t *testing.T) {
	offers, panic := offer([]*registryv1.Instance{
		inst("a", "10.0.0.1:80", "z1", 200, serving, healthy),
		inst("b", "10.0.0.2:80", "z1", 100, serving, degraded),
		inst("c", "10.0.0.3:80", "z2", 100, draining, healthy),
		inst("d", "10.0.0.4:80", "z2", 100, serving, unavail),
		inst("e", "10.0.0.5:80", "z2", 100, starting, healthy),
		inst("f", "10.0.0.6:80", "z2", 100, serving, unknown),
	}, 50)
	if panic {
		t.Fatal("2 of 4 routable is not panic at 50%")
	}
	want := map[string]struct {
		status corev3.HealthStatus
		weight uint32
	}{"a": {corev3.HealthStatus_HEALTHY, 200}, "b": {corev3.HealthStatus_DEGRADED, 25}, "c": {corev3.HealthStatus_DRAINING, 100}}
	if len(offers) != len(want) {
		t.Fatalf("offered %d instances, want %d: %+v", len(offers), len(want), offers)
	}
	for _, o := range offers {
		w, ok := want[o.in.Id]
		if !ok || o.status != w.status || o.weight != w.weight {
			t.Errorf("%s offered %v weight %d, want %+v", o.in.Id, o.status, o.weight, w)
		}
	}
}

// Below the threshold every instance neither draining nor starting is
// offered, as usable.
func TestOfferPanic(t *testing.T) {
	offers, panic := offer([]*registryv1.Instance{
		inst("a", "10.0.0.1:80", "", 100, serving, healthy),
		inst("b", "10.0.0.2:80", "", 100, serving, unavail),
		inst("c", "10.0.0.3:80", "", 100, serving, unavail),
		inst("d", "10.0.0.4:80", "", 100, serving, unavail),
		inst("e", "10.0.0.5:80", "", 100, draining, healthy),
	}, 50)
	if !panic || len(offers) != 5 {
		t.Fatalf("panic %v, %d offered, want panic and 5", panic, len(offers))
	}
	for _, o := range offers {
		if o.in.Id == "e" && o.status != corev3.HealthStatus_DRAINING || o.in.Id != "e" && o.status != corev3.HealthStatus_HEALTHY {
			t.Errorf("%s offered %v", o.in.Id, o.status)
		}
	}
}

// gRPC: one locality per instance weighted by it, DEGRADED as HEALTHY
// (gRPC drops DEGRADED), the caller's zone first by priority while it has
// a usable instance, an address given once. Envoy: localities by zone,
// statuses as they are.
func TestAssignmentVariants(t *testing.T) {
	offers, _ := offer([]*registryv1.Instance{
		inst("a", "10.0.0.1:80", "z1", 200, serving, healthy),
		inst("b", "10.0.0.2:80", "z1", 100, serving, degraded),
		inst("c", "10.0.0.3:80", "z2", 100, serving, healthy),
		inst("d", "10.0.0.3:80", "z2", 100, serving, healthy), // the same address as c
		inst("e", "10.0.0.5:80", "z2", 100, draining, healthy),
	}, 50)
	g := assignment("orders", offers, variant{kind: kindGRPC, zone: "z2"})
	if len(g.Endpoints) != 4 {
		t.Fatalf("gRPC: %d localities, want 4 (d's address is c's)", len(g.Endpoints))
	}
	for _, l := range g.Endpoints {
		ep := l.LbEndpoints[0]
		id := l.Locality.SubZone
		wantPrio := uint32(1)
		if l.Locality.Zone == "z2" {
			wantPrio = 0
		}
		if l.Priority != wantPrio {
			t.Errorf("gRPC %s: priority %d, want %d", id, l.Priority, wantPrio)
		}
		switch id {
		case "b":
			if ep.HealthStatus != corev3.HealthStatus_HEALTHY || l.LoadBalancingWeight.Value != 25 {
				t.Errorf("gRPC b (DEGRADED): %v weight %d, want HEALTHY at 25", ep.HealthStatus, l.LoadBalancingWeight.Value)
			}
		case "e":
			if ep.HealthStatus != corev3.HealthStatus_DRAINING {
				t.Errorf("gRPC e: %v, want DRAINING", ep.HealthStatus)
			}
		case "a":
			if l.LoadBalancingWeight.Value != 200 {
				t.Errorf("gRPC a: locality weight %d, want 200", l.LoadBalancingWeight.Value)
			}
		}
	}
	// A zone with nothing usable: no priorities, all at 0.
	for _, l := range assignment("orders", offers, variant{kind: kindGRPC, zone: "z9"}).Endpoints {
		if l.Priority != 0 {
			t.Errorf("zone without instances: %s at priority %d", l.Locality.SubZone, l.Priority)
		}
	}
	e := assignment("orders", offers, variant{kind: kindEnvoy})
	if len(e.Endpoints) != 2 || e.Endpoints[0].Locality.Zone != "z1" || len(e.Endpoints[1].LbEndpoints) != 3 {
		t.Fatalf("Envoy: want localities z1 (2) and z2 (3), got %v", e.Endpoints)
	}
	if st := e.Endpoints[0].LbEndpoints[1].HealthStatus; st != corev3.HealthStatus_DEGRADED {
		t.Errorf("Envoy b: %v, want DEGRADED", st)
	}
}

// Envoy is told apart by its user agent; a zone that is not a short
// printable name is dropped.
func TestClassify(t *testing.T) {
	for _, tc := range []struct {
		n    *corev3.Node
		want variant
	}{
		{&corev3.Node{UserAgentName: "envoy", Locality: &corev3.Locality{Zone: "z1"}}, variant{kind: kindEnvoy}},
		{&corev3.Node{UserAgentName: "gRPC Go", Locality: &corev3.Locality{Zone: "z1"}}, variant{kind: kindGRPC, zone: "z1"}},
		{&corev3.Node{UserAgentName: "gRPC Python", Locality: &corev3.Locality{Zone: "a|b"}}, variant{kind: kindGRPC}},
		{nil, variant{kind: kindGRPC}},
	} {
		if got := classify(tc.n); got != tc.want {
			t.Errorf("classify(%v) = %v, want %v", tc.n, got, tc.want)
		}
	}
}

// Envoy is asked for HTTP/2 to the instances (they are gRPC servers).
func TestClusterAsksEnvoyForHTTP2(t *testing.T) {
	opts := cluster("orders", kindEnvoy).TypedExtensionProtocolOptions["envoy.extensions.upstreams.http.v3.HttpProtocolOptions"]
	p := &upstreamhttpv3.HttpProtocolOptions{}
	if opts == nil || opts.UnmarshalTo(p) != nil || p.GetExplicitHttpConfig().GetHttp2ProtocolOptions() == nil {
		t.Fatalf("cluster's upstream protocol options: %v", opts)
	}
}

// gRPC clients' clusters offer the SDK's policy first (gRFC A52) and
// gRPC's weighted localities after it; Envoy's carry no policy list.
func TestClusterPolicies(t *testing.T) {
	ps := cluster("orders", kindGRPC).GetLoadBalancingPolicy().GetPolicies()
	if len(ps) != 2 || ps[0].GetTypedExtensionConfig().GetName() != "registry_weighted" ||
		ps[1].GetTypedExtensionConfig().GetName() != "envoy.load_balancing_policies.wrr_locality" {
		t.Fatalf("gRPC cluster policies: %v", ps)
	}
	if p := cluster("orders", kindEnvoy).GetLoadBalancingPolicy(); p != nil {
		t.Fatalf("Envoy cluster policies: %v, want none", p)
	}
}
