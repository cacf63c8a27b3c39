package render

import (
	"sort"

	registryv1 "github.com/regcluster/registry/proto/registry/v1"
)

// ServiceCounts is one service's instances counted by state, one element of
// `regctl services -o json`. Lifecycle counts (starting, serving, draining)
// and health counts (healthy, degraded, unavailable, unknown) each add up
// to Total.
type ServiceCounts struct {
	Service     string `json:"service"`
	Total       int64  `json:"total"`
	Starting    int64  `json:"starting"`
	Serving     int64  `json:"serving"`
	Draining    int64  `json:"draining"`
	Healthy     int64  `json:"healthy"`
	Degraded    int64  `json:"degraded"`
	Unavailable int64  `json:"unavailable"`
	Unknown     int64  `json:"unknown"`
}

// CountServices counts insts by service, lifecycle and health, sorted by
// service. An instance with an unspecified lifecycle counts as serving (that
// is what registering it means); one with no health verdict as unknown. The
// result is never nil.
func CountServices(insts []*registryv1.Instance) []ServiceCounts {
	by := map[string]*ServiceCounts{}
	for _, inst := range insts {
		c := by[inst.GetService()]
		if c == nil {
			c = &ServiceCounts{Service: inst.GetService()}
			by[inst.GetService()] = c
		}
		c.Total++
		switch inst.GetLifecycle() {
		case registryv1.Lifecycle_LIFECYCLE_STARTING:
			c.Starting++
		case registryv1.Lifecycle_LIFECYCLE_DRAINING:
			c.Draining++
		default:
			c.Serving++
		}
		switch inst.GetHealth().GetState() {
		case registryv1.HealthState_HEALTH_STATE_HEALTHY:
			c.Healthy++
		case registryv1.HealthState_HEALTH_STATE_DEGRADED:
			c.Degraded++
		case registryv1.HealthState_HEALTH_STATE_UNAVAILABLE:
			c.Unavailable++
		default:
			c.Unknown++
		}
	}
	out := make([]ServiceCounts, 0, len(by))
	for _, c := range by {
		out = append(out, *c)
	}
	sort.Slice(out, func(i, j int) bool { return out[i].Service < out[j].Service })
	return out
}
