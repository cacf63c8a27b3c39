package record

import (
	"testing"

	registryv1 "github.com/regcluster/registry/proto/registry/v1"
)

// Every combination of lifecycle, health and check that Routable decides.
func TestRoutable(t *testing.T) {
	const (
		serving  = registryv1.Lifecycle_LIFECYCLE_SERVING
		draining = registryv1.Lifecycle_LIFECYCLE_DRAINING
		starting = registryv1.Lifecycle_LIFECYCLE_STARTING

		unknown     = registryv1.HealthState_HEALTH_STATE_UNKNOWN
		healthy     = registryv1.HealthState_HEALTH_STATE_HEALTHY
		degraded    = registryv1.HealthState_HEALTH_STATE_DEGRADED
		unavailable = registryv1.HealthState_HEALTH_STATE_UNAVAILABLE
	)
	tcp := &registryv1.HealthCheck{Kind: registryv1.CheckKind_CHECK_KIND_TCP}
	none := &registryv1.HealthCheck{Kind: registryv1.CheckKind_CHECK_KIND_NONE}
	tests := []struct {
		name   string
		lc     registryv1.Lifecycle
		health *registryv1.Health // nil: never probed
		check  *registryv1.HealthCheck
		want   bool
	}{
		{"no check, never probed", serving, nil, nil, true},
		{"check none, never probed", serving, nil, none, true},
		{"check, never probed", serving, nil, tcp, false},
		{"check, explicit unknown", serving, &registryv1.Health{State: unknown}, tcp, false},
		{"check, healthy", serving, &registryv1.Health{State: healthy}, tcp, true},
		{"check, degraded", serving, &registryv1.Health{State: degraded}, tcp, true},
		{"check, unavailable", serving, &registryv1.Health{State: unavailable}, tcp, false},
		{"no check, unavailable", serving, &registryv1.Health{State: unavailable}, nil, false},
		{"no check, healthy", serving, &registryv1.Health{State: healthy}, nil, true},
		{"out-of-enum health", serving, &registryv1.Health{State: 42}, tcp, false},
		{"draining, healthy", draining, &registryv1.Health{State: healthy}, tcp, false},
		{"draining, no check", draining, nil, nil, false},
		{"starting, healthy", starting, &registryv1.Health{State: healthy}, tcp, false},
		{"unspecified lifecycle", registryv1.Lifecycle_LIFECYCLE_UNSPECIFIED, &registryv1.Health{State: healthy}, nil, false},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			in := &registryv1.Instance{Service: "s", Id: "i", Lifecycle: tc.lc, Health: tc.health, Check: tc.check}
			if got := Routable(in); got != tc.want {
				t.Errorf("Routable(lifecycle %v, health %v, check %v) = %v, want %v", tc.lc, tc.health.GetState(), tc.check.GetKind(), got, tc.want)
			}
		})
	}
	if Routable(nil) {
		t.Error("Routable(nil) = true")
	}
}
