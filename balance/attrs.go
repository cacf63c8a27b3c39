package balance

import (
	"log/slog"
	"time"

	"google.golang.org/grpc/resolver"

	registryv1 "github.com/regcluster/registry/proto/registry/v1"
)

// Instance is what the balancer knows of one endpoint's registry record.
// The resolver sets it on resolver.Endpoint.Attributes (never on the
// addresses: pickfirst compares addresses, so a change of weight or
// health here never reconnects).
type Instance struct {
	// ID is the instance id.
	ID string
	// Zone is the instance's zone.
	Zone string
	// Weight is the effective registry weight (reduced while DEGRADED), ≥ 1.
	Weight uint32
	// Health is the registry's health state.
	Health registryv1.HealthState
	// Lifecycle is the registry's lifecycle state.
	Lifecycle registryv1.Lifecycle
	// Routable is record.Routable: SERVING and not UNAVAILABLE.
	Routable bool
	// RoutableSince is when the registry saw the instance become routable
	// (the record's routable_since), the start of its slow start; zero
	// when the record does not say.
	RoutableSince time.Time
}

// Equal compares by value, as grpc-go's attributes.Equal expects of a
// value that is not comparable with == in a useful way (time.Time).
func (i Instance) Equal(o any) bool {
	oi, ok := o.(Instance)
	return ok && i.ID == oi.ID && i.Zone == oi.Zone && i.Weight == oi.Weight && i.Health == oi.Health &&
		i.Lifecycle == oi.Lifecycle && i.Routable == oi.Routable && i.RoutableSince.Equal(oi.RoutableSince)
}

type instanceKey struct{}

// WithInstance returns ep carrying in.
func WithInstance(ep resolver.Endpoint, in Instance) resolver.Endpoint {
	ep.Attributes = ep.Attributes.WithValue(instanceKey{}, in)
	return ep
}

// InstanceOf returns the Instance an endpoint carries, if any.
func InstanceOf(ep resolver.Endpoint) (Instance, bool) {
	in, ok := ep.Attributes.Value(instanceKey{}).(Instance)
	return in, ok
}

// Service is what the balancer knows of the whole service, set by the
// resolver on resolver.State.Attributes. It lets the balancer tell "no
// list yet" from "an empty list" from "all draining", and carries the
// instances that are not routable (UNAVAILABLE, not yet probed; never
// STARTING or DRAINING)
// so that panic mode can reach them, while a balancer that is not ours
// sees only the routable ones in State.Endpoints.
type Service struct {
	// Name is the service name.
	Name string
	// Known is true once a view of the service exists (a snapshot).
	Known bool
	// Unreached, while Known is false, says the registry was tried and
	// not reached within the client's connect timeout: the balancer
	// reports TRANSIENT_FAILURE, so fail-fast calls fail with "registry
	// not reached yet" and wait-for-ready calls wait. Until then (Known
	// and Unreached both false) the channel is CONNECTING and every call
	// waits for the first view, as for any resolver's first result.
	Unreached bool
	// Refused, while Known is false, is why a regnode refused to follow
	// the service (a permission or argument error, not a connection
	// failure): the balancer fails calls with it at once.
	Refused string
	// Registered counts the instances in the view, draining included.
	Registered int
	// Draining counts the DRAINING instances (never in any endpoint list).
	Draining int
	// Standby are the non-routable instances that are neither DRAINING
	// nor STARTING: only panic mode calls them.
	Standby []resolver.Endpoint
	// Metrics receives the balancer's and the interceptor's counts; nil
	// gives each balancer its own.
	Metrics *Metrics
	// LocalZone is the caller's zone (client.Config.Zone): zone-aware
	// routing prefers it while it has the capacity; "" turns it off.
	LocalZone string
	// Logger logs ejections, returns and panic mode (nil: slog.Default()).
	Logger *slog.Logger
}

// Equal compares by value (the endpoint lists by address and instance).
func (s *Service) Equal(o any) bool {
	os, ok := o.(*Service)
	if !ok || os == nil || s == nil {
		return ok && s == os
	}
	if s.Name != os.Name || s.Known != os.Known || s.Unreached != os.Unreached || s.Refused != os.Refused || s.Registered != os.Registered || s.Draining != os.Draining ||
		s.Metrics != os.Metrics || s.Logger != os.Logger || s.LocalZone != os.LocalZone || len(s.Standby) != len(os.Standby) {
		return false
	}
	for i := range s.Standby {
		a, b := s.Standby[i], os.Standby[i]
		ia, _ := InstanceOf(a)
		ib, _ := InstanceOf(b)
		if len(a.Addresses) != len(b.Addresses) || !ia.Equal(ib) {
			return false
		}
		for j := range a.Addresses {
			if !a.Addresses[j].Equal(b.Addresses[j]) {
				return false
			}
		}
	}
	return true
}

type serviceKey struct{}

// WithService returns st carrying svc.
func WithService(st resolver.State, svc *Service) resolver.State {
	st.Attributes = st.Attributes.WithValue(serviceKey{}, svc)
	return st
}

// ServiceOf returns the Service a resolver state carries, or nil.
func ServiceOf(st resolver.State) *Service {
	s, _ := st.Attributes.Value(serviceKey{}).(*Service)
	return s
}

// waiting reports whether the service's first view is still on its way:
// no view, the registry not yet found unreachable, nothing refused.
func (s *Service) waiting() bool {
	return !s.Known && !s.Unreached && s.Refused == ""
}
