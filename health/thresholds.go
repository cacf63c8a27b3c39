package health

import (
	"errors"
	"fmt"
	"math"
	"time"

	"github.com/regcluster/registry/internal/configerr"
	registryv1 "github.com/regcluster/registry/proto/registry/v1"
)

// The default thresholds (docs/architecture.md, from the seeds).
const (
	DefaultFailuresToDegraded    = 3
	DefaultFailuresToUnavailable = 5
	DefaultSuccessesToHealthy    = 3
	DefaultSuccessesToDegraded   = 5
	DefaultSlow                  = 100 * time.Millisecond

	// MaxCount is the largest count Validate accepts.
	MaxCount = 100
)

// Thresholds are the hysteresis parameters of a Machine.
type Thresholds struct {
	// FailuresToDegraded (N) is how many consecutive failed or slow results
	// take HEALTHY to DEGRADED.
	FailuresToDegraded int
	// FailuresToUnavailable (M) is how many consecutive failures take
	// DEGRADED to UNAVAILABLE. A slow result is a response, not a failure:
	// it does not count, and it interrupts the run.
	FailuresToUnavailable int
	// SuccessesToHealthy (K) is how many consecutive OK results (not slow)
	// take DEGRADED to HEALTHY.
	SuccessesToHealthy int
	// SuccessesToDegraded (L) is how many consecutive responses (OK or
	// slow) take UNAVAILABLE to DEGRADED. UNAVAILABLE never goes straight
	// to HEALTHY.
	SuccessesToDegraded int
	// Slow is the latency above which a successful probe counts as slow.
	Slow time.Duration
}

// DefaultThresholds returns N=3, M=5, K=3, L=5 and a 100ms slow threshold.
func DefaultThresholds() Thresholds {
	return Thresholds{
		FailuresToDegraded:    DefaultFailuresToDegraded,
		FailuresToUnavailable: DefaultFailuresToUnavailable,
		SuccessesToHealthy:    DefaultSuccessesToHealthy,
		SuccessesToDegraded:   DefaultSuccessesToDegraded,
		Slow:                  DefaultSlow,
	}
}

// ErrInvalidThresholds is wrapped by every error of Thresholds.Validate.
var ErrInvalidThresholds = errors.New("health: invalid thresholds")

// Validate reports every field out of range (each count 1..MaxCount, Slow
// above zero), each a *configerr.Error naming the field
// ("health: Thresholds.Slow must be > 0, got 0s") and wrapping
// ErrInvalidThresholds; nil means t is usable as it is.
func (t Thresholds) Validate() error {
	var errs []error
	for _, c := range []struct {
		name string
		v    int
	}{
		{"FailuresToDegraded", t.FailuresToDegraded},
		{"FailuresToUnavailable", t.FailuresToUnavailable},
		{"SuccessesToHealthy", t.SuccessesToHealthy},
		{"SuccessesToDegraded", t.SuccessesToDegraded},
	} {
		if c.v < 1 || c.v > MaxCount {
			errs = append(errs, configerr.New(ErrInvalidThresholds, "health", c.name, c.v, fmt.Sprintf("must be 1..%d", MaxCount)).Of("Thresholds"))
		}
	}
	if t.Slow <= 0 {
		errs = append(errs, configerr.New(ErrInvalidThresholds, "health", "Slow", t.Slow, "must be > 0").Of("Thresholds"))
	}
	return errors.Join(errs...)
}

// With returns t overridden by the non-zero fields of an instance's check
// spec (the four counts and slow_threshold); a nil spec returns t. It does
// not validate: call Validate on the result, since the spec comes from users.
func (t Thresholds) With(spec *registryv1.HealthCheck) Thresholds {
	if spec == nil {
		return t
	}
	override := func(dst *int, v uint32) {
		if v != 0 {
			*dst = int(min(uint64(v), math.MaxInt32))
		}
	}
	override(&t.FailuresToDegraded, spec.GetFailuresToDegraded())
	override(&t.FailuresToUnavailable, spec.GetFailuresToUnavailable())
	override(&t.SuccessesToHealthy, spec.GetSuccessesToHealthy())
	override(&t.SuccessesToDegraded, spec.GetSuccessesToDegraded())
	if d := spec.GetSlowThreshold(); d != nil {
		if v := d.AsDuration(); v != 0 {
			t.Slow = v
		}
	}
	return t
}
