package lastresort

import "errors"

// ErrConfig is wrapped by every error of Config.Validate.
var ErrConfig = errors.New("lastresort: invalid config")

// EndReason says why a last resort ended.
type EndReason int

const (
	// EndReturned: every instance kept was registered again.
	EndReturned EndReason = iota + 1
	// EndGrace: the grace ran out.
	EndGrace
	// EndDeliberate: one of the service's instances was removed
	// deliberately (deleted while DRAINING): someone is changing the
	// service on purpose, and what they removed must not be called.
	EndDeliberate
	// EndForgotten: the caller called Forget (its view was replaced by
	// one that is no news of the service, such as a disk cache's).
	EndForgotten
)

// String is the reason's name, as used in logs and metric labels.
func (r EndReason) String() string {
	switch r {
	case EndReturned:
		return "returned"
	case EndGrace:
		return "grace"
	case EndDeliberate:
		return "deliberate"
	case EndForgotten:
		return "forgotten"
	}
	return "unknown"
}
