package client

import (
	"google.golang.org/grpc/attributes"
	"google.golang.org/grpc/resolver"

	"github.com/regcluster/registry/balance"
	registryv1 "github.com/regcluster/registry/proto/registry/v1"
	"github.com/regcluster/registry/record"
)

// resolverState is what the resolver of service pushes to gRPC for insts
// (one snapshot of the subscription; known is false before the first, and
// w then says whether the registry was unreached or refused): the
// routable instances as Endpoints (and, for balancers that still read
// them, Addresses with the weight/zone/health/id balancer attributes),
// each endpoint carrying a balance.Instance; a balance.Service on the
// state saying whether a view exists, how many are registered and
// draining, and the non-routable, non-draining instances that only panic
// mode may call; and the service config that selects package balance's
// policy with the service's Policy, so grpc.WithResolvers alone gets it.
//
// DRAINING instances are in no list: they never get a new call, and a
// balancer that is not ours cannot send them one either.
func resolverState(c *Client, service string, insts, lastResort []*registryv1.Instance, known bool, w waitState, cc resolver.ClientConn) resolver.State {
	svc := &balance.Service{Name: service, Known: known, Metrics: c.metrics, Logger: c.log, LocalZone: c.zone}
	if !known {
		svc.Unreached, svc.Refused = w.unreached, w.refused
	}
	svc.Registered = len(insts)
	var st resolver.State
	for _, in := range insts {
		if in.GetLifecycle() == registryv1.Lifecycle_LIFECYCLE_DRAINING {
			svc.Draining++
			continue
		}
		routable := record.Routable(in)
		bi := balance.Instance{
			ID: in.Id, Zone: in.Zone, Weight: record.EffectiveWeight(in), Health: in.GetHealth().GetState(),
			Lifecycle: in.GetLifecycle(), Routable: routable,
		}
		if ts := in.GetRoutableSince(); ts != nil {
			bi.RoutableSince = ts.AsTime()
		}
		ep := balance.WithInstance(resolver.Endpoint{Addresses: []resolver.Address{{Addr: in.Address}}}, bi)
		if !routable {
			// Panic mode may call an instance the prober judges sick (the
			// prober can be wrong), but never one that says itself it is
			// not ready yet: STARTING is in no list.
			if in.GetLifecycle() != registryv1.Lifecycle_LIFECYCLE_STARTING {
				svc.Standby = append(svc.Standby, ep)
			}
			continue
		}
		st.Endpoints = append(st.Endpoints, ep)
		attrs := attributes.New(AttrWeight, bi.Weight).
			WithValue(AttrZone, in.Zone).
			WithValue(AttrHealth, bi.Health).
			WithValue(AttrID, in.Id)
		st.Addresses = append(st.Addresses, resolver.Address{Addr: in.Address, BalancerAttributes: attrs})
	}
	if len(st.Endpoints) == 0 {
		// Nothing routable: the instances that vanished by accident, as
		// they were, at their full weight (Subscription's last resort).
		for _, in := range lastResort {
			bi := balance.Instance{ID: in.Id, Zone: in.Zone, Weight: record.EffectiveWeight(asRoutable(in)),
				Health: registryv1.HealthState_HEALTH_STATE_HEALTHY, Lifecycle: registryv1.Lifecycle_LIFECYCLE_SERVING, Routable: true}
			st.Endpoints = append(st.Endpoints, balance.WithInstance(resolver.Endpoint{Addresses: []resolver.Address{{Addr: in.Address}}}, bi))
			attrs := attributes.New(AttrWeight, bi.Weight).
				WithValue(AttrZone, in.Zone).
				WithValue(AttrHealth, bi.Health).
				WithValue(AttrID, in.Id)
			st.Addresses = append(st.Addresses, resolver.Address{Addr: in.Address, BalancerAttributes: attrs})
		}
	}
	st = balance.WithService(st, svc)
	if sc, err := balance.ServiceConfig(c.policyFor(service)); err == nil {
		if pr := cc.ParseServiceConfig(sc); pr != nil && pr.Err == nil {
			st.ServiceConfig = pr
		} else if pr != nil {
			c.log.Warn("service config not pushed", "service", service, "error", pr.Err)
		}
	}
	return st
}

// asRoutable is in as a routable record would be: SERVING and HEALTHY, its
// weight kept (a last resort is called at its normal weight, not a
// DEGRADED one's).
func asRoutable(in *registryv1.Instance) *registryv1.Instance {
	return &registryv1.Instance{Weight: in.GetWeight(), Lifecycle: registryv1.Lifecycle_LIFECYCLE_SERVING,
		Health: &registryv1.Health{State: registryv1.HealthState_HEALTH_STATE_HEALTHY}}
}
