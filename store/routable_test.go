package store_test

import (
	"context"
	"testing"
	"time"

	"google.golang.org/protobuf/types/known/timestamppb"

	registryv1 "github.com/regcluster/registry/proto/registry/v1"
)

// Every write path stamps routable_since: registration, a health write
// (the prober's UpdateIf) taking it out and back, a drain and an undrain;
// a write that keeps it routable keeps the stamp.
func TestWritesStampRoutableSince(t *testing.T) {
	s, _, _ := newStore(t)
	ctx := context.Background()
	reg, err := s.Register(ctx, inst("orders", "o-1"), time.Hour)
	if err != nil {
		t.Fatal(err)
	}
	first := reg.Instance.GetRoutableSince()
	if first == nil {
		t.Fatal("registration did not stamp routable_since")
	}
	health := func(st registryv1.HealthState) *registryv1.Instance {
		t.Helper()
		in, _, err := s.Update(ctx, "orders", "o-1", func(in *registryv1.Instance) error {
			in.Health = &registryv1.Health{State: st, Since: timestamppb.Now()}
			return nil
		})
		if err != nil {
			t.Fatal(err)
		}
		return in
	}
	if in := health(registryv1.HealthState_HEALTH_STATE_HEALTHY); !in.GetRoutableSince().AsTime().Equal(first.AsTime()) {
		t.Fatalf("still routable, stamp moved: %v -> %v", first, in.GetRoutableSince())
	}
	if in := health(registryv1.HealthState_HEALTH_STATE_UNAVAILABLE); in.GetRoutableSince() != nil {
		t.Fatal("UNAVAILABLE kept routable_since")
	}
	back := health(registryv1.HealthState_HEALTH_STATE_HEALTHY).GetRoutableSince()
	if back == nil || !back.AsTime().After(first.AsTime()) {
		t.Fatalf("back from UNAVAILABLE: routable_since %v (registered %v)", back, first)
	}
	in, _, err := s.SetLifecycle(ctx, "orders", "o-1", registryv1.Lifecycle_LIFECYCLE_DRAINING, "test")
	if err != nil || in.GetRoutableSince() != nil {
		t.Fatalf("drained: %v %v", in.GetRoutableSince(), err)
	}
	in, _, err = s.SetLifecycle(ctx, "orders", "o-1", registryv1.Lifecycle_LIFECYCLE_SERVING, "")
	if err != nil || in.GetRoutableSince() == nil || !in.GetRoutableSince().AsTime().After(back.AsTime()) {
		t.Fatalf("undrained: %v %v", in.GetRoutableSince(), err)
	}
	got, _, err := s.Get(ctx, "orders", "o-1")
	if err != nil || !got.GetRoutableSince().AsTime().Equal(in.GetRoutableSince().AsTime()) {
		t.Fatalf("stored %v, returned %v (%v)", got.GetRoutableSince(), in.GetRoutableSince(), err)
	}
	// The same owner registering over its live record (it lost track of
	// its lease): still routable, so the stamp stays and no client ramps
	// it again.
	again, err := s.RegisterAs(ctx, reg.Secret, inst("orders", "o-1"), 0)
	if err != nil {
		t.Fatal(err)
	}
	if !again.Instance.GetRoutableSince().AsTime().Equal(in.GetRoutableSince().AsTime()) {
		t.Fatalf("re-registration moved routable_since %v -> %v", in.GetRoutableSince(), again.Instance.GetRoutableSince())
	}
}
