package record_test

import (
	"testing"
	"time"

	"google.golang.org/protobuf/types/known/timestamppb"

	registryv1 "github.com/regcluster/registry/proto/registry/v1"
	"github.com/regcluster/registry/record"
)

func TestStampRoutable(t *testing.T) {
	t0, t1 := time.Unix(1000, 0), time.Unix(2000, 0)
	serving := func(h registryv1.HealthState, since *timestamppb.Timestamp) *registryv1.Instance {
		return &registryv1.Instance{Lifecycle: registryv1.Lifecycle_LIFECYCLE_SERVING,
			Health: &registryv1.Health{State: h}, RoutableSince: since}
	}
	healthy, down := registryv1.HealthState_HEALTH_STATE_HEALTHY, registryv1.HealthState_HEALTH_STATE_UNAVAILABLE
	for name, tc := range map[string]struct {
		old, next *registryv1.Instance
		want      *timestamppb.Timestamp
	}{
		"new routable":         {nil, serving(healthy, nil), timestamppb.New(t1)},
		"back from down":       {serving(down, nil), serving(healthy, nil), timestamppb.New(t1)},
		"stays routable":       {serving(healthy, timestamppb.New(t0)), serving(healthy, timestamppb.New(t0)), timestamppb.New(t0)},
		"goes down":            {serving(healthy, timestamppb.New(t0)), serving(down, timestamppb.New(t0)), nil},
		"undrained":            {&registryv1.Instance{Lifecycle: registryv1.Lifecycle_LIFECYCLE_DRAINING}, serving(healthy, nil), timestamppb.New(t1)},
		"drained":              {serving(healthy, timestamppb.New(t0)), &registryv1.Instance{Lifecycle: registryv1.Lifecycle_LIFECYCLE_DRAINING, RoutableSince: timestamppb.New(t0)}, nil},
		"legacy stays no ramp": {serving(healthy, nil), serving(registryv1.HealthState_HEALTH_STATE_DEGRADED, nil), nil},
	} {
		record.StampRoutable(tc.old, tc.next, t1)
		if got := tc.next.GetRoutableSince(); !got.AsTime().Equal(tc.want.AsTime()) || (got == nil) != (tc.want == nil) {
			t.Errorf("%s: routable_since %v, want %v", name, got, tc.want)
		}
	}
}
