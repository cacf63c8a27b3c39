package record

import (
	"time"

	"google.golang.org/protobuf/types/known/timestamppb"

	registryv1 "github.com/regcluster/registry/proto/registry/v1"
)

// StampRoutable sets next.routable_since for a write that replaces old
// (nil for a new record) with next, at now: now when next becomes
// routable (new, back from UNAVAILABLE, undrained), old's value while it
// stays routable, nil while it is not. It is the start of the clients'
// slow start, written once by the registry so every client ramps the
// instance in step. A record that was routable before the field existed
// keeps no value (no ramp), rather than ramping on its next unrelated
// write.
func StampRoutable(old, next *registryv1.Instance, now time.Time) {
	switch {
	case !Routable(next):
		next.RoutableSince = nil
	case old == nil || !Routable(old):
		next.RoutableSince = timestamppb.New(now)
	default:
		next.RoutableSince = old.GetRoutableSince()
	}
}
