package balance

import (
	"encoding/json"
	"errors"
	"fmt"
	"strings"
	"time"

	"google.golang.org/grpc/serviceconfig"
)

// Pickers a Policy can name.
const (
	// PickerP2C is weighted power-of-two-choices least-request (default).
	PickerP2C = "p2c"
	// PickerWRR is smooth weighted round robin (nginx's algorithm).
	PickerWRR = "wrr"
)

// ErrInvalidPolicy is wrapped by every error of Policy.Validate.
var ErrInvalidPolicy = errors.New("invalid balancing policy")

// Policy is the whole behaviour of the balancer and the retry interceptor
// for one service. The zero value is not valid: start from DefaultPolicy.
// As JSON (the policy's entry in a service config's loadBalancingConfig)
// field names are lowerCamelCase and durations are strings ("30s"); a
// field left out keeps its default.
type Policy struct {
	// Picker is PickerP2C or PickerWRR.
	Picker string

	// SlowStartWindow is how long an instance that became routable ramps
	// (5%, 25%, 50%, then 100% of its weight, each for a third of the
	// window). 0 turns slow start off.
	SlowStartWindow time.Duration

	// ConsecutiveFailures of one instance eject it (instance-level
	// failures only: Unavailable, DeadlineExceeded, ResourceExhausted).
	ConsecutiveFailures int
	// BaseEjection is the first ejection's length; the n-th recent one
	// lasts n times as long, up to MaxEjection.
	BaseEjection time.Duration
	// MaxEjection caps one ejection's length.
	MaxEjection time.Duration
	// MaxEjectionPercent of a service's instances may be ejected by one
	// client at once (rounded down).
	MaxEjectionPercent int
	// HalfOpenSuccesses in a row bring an ejected instance back.
	HalfOpenSuccesses int

	// PanicThresholdPercent: when the healthy instances (routable and not
	// ejected) are fewer than this share of the registered, non-draining
	// ones, calls spread over every non-draining instance. 0 turns panic
	// mode off.
	PanicThresholdPercent int

	// ZoneMinInstances: zone-aware routing (with a caller zone set) only
	// works over at least this many healthy instances.
	ZoneMinInstances int

	// MaxRetries after the first attempt (0..5).
	MaxRetries int
	// RetryBackoff is the base of the jittered exponential backoff
	// between attempts; RetryBackoffMax caps it.
	RetryBackoff, RetryBackoffMax time.Duration
	// Idempotent methods also retry Unavailable and DeadlineExceeded
	// (which the server may have processed). Entries are full method
	// names ("/pkg.Service/Method") or a service wildcard
	// ("/pkg.Service/*").
	Idempotent []string
	// RetryBudgetPercent: retries may be at most this share of the calls
	// over RetryBudgetWindow, plus RetryBudgetMinPerSecond.
	RetryBudgetPercent int
	// RetryBudgetMinPerSecond lets a few retries through on a quiet
	// channel, where a percentage of few calls is nothing.
	RetryBudgetMinPerSecond int
	// RetryBudgetWindow is the window the budget counts over.
	RetryBudgetWindow time.Duration
}

// DefaultPolicy returns the defaults documented in the package doc.
func DefaultPolicy() Policy {
	return Policy{
		Picker:                  PickerP2C,
		SlowStartWindow:         30 * time.Second,
		ConsecutiveFailures:     5,
		BaseEjection:            30 * time.Second,
		MaxEjection:             300 * time.Second,
		MaxEjectionPercent:      50,
		HalfOpenSuccesses:       2,
		PanicThresholdPercent:   50,
		ZoneMinInstances:        6,
		MaxRetries:              2,
		RetryBackoff:            10 * time.Millisecond,
		RetryBackoffMax:         100 * time.Millisecond,
		RetryBudgetPercent:      20,
		RetryBudgetMinPerSecond: 3,
		RetryBudgetWindow:       10 * time.Second,
	}
}

// Validate reports the first field out of range, named as in JSON.
func (p Policy) Validate() error {
	bad := func(field, format string, args ...any) error {
		return fmt.Errorf("%w: %s: %s", ErrInvalidPolicy, field, fmt.Sprintf(format, args...))
	}
	switch {
	case p.Picker != PickerP2C && p.Picker != PickerWRR:
		return bad("picker", "%q is neither %q nor %q", p.Picker, PickerP2C, PickerWRR)
	case p.SlowStartWindow < 0 || p.SlowStartWindow > time.Hour:
		return bad("slowStartWindow", "%v not in 0..1h", p.SlowStartWindow)
	case p.ConsecutiveFailures < 1 || p.ConsecutiveFailures > 1000:
		return bad("consecutiveFailures", "%d not in 1..1000", p.ConsecutiveFailures)
	case p.BaseEjection <= 0 || p.BaseEjection > time.Hour:
		return bad("baseEjection", "%v not in (0, 1h]", p.BaseEjection)
	case p.MaxEjection < p.BaseEjection || p.MaxEjection > 24*time.Hour:
		return bad("maxEjection", "%v not in [baseEjection, 24h]", p.MaxEjection)
	case p.MaxEjectionPercent < 0 || p.MaxEjectionPercent > 100:
		return bad("maxEjectionPercent", "%d not in 0..100", p.MaxEjectionPercent)
	case p.HalfOpenSuccesses < 1 || p.HalfOpenSuccesses > 100:
		return bad("halfOpenSuccesses", "%d not in 1..100", p.HalfOpenSuccesses)
	case p.PanicThresholdPercent < 0 || p.PanicThresholdPercent > 100:
		return bad("panicThresholdPercent", "%d not in 0..100", p.PanicThresholdPercent)
	case p.ZoneMinInstances < 1 || p.ZoneMinInstances > 10000:
		return bad("zoneMinInstances", "%d not in 1..10000", p.ZoneMinInstances)
	case p.MaxRetries < 0 || p.MaxRetries > 5:
		return bad("maxRetries", "%d not in 0..5", p.MaxRetries)
	case p.RetryBackoff <= 0 || p.RetryBackoff > time.Minute:
		return bad("retryBackoff", "%v not in (0, 1m]", p.RetryBackoff)
	case p.RetryBackoffMax < p.RetryBackoff || p.RetryBackoffMax > time.Minute:
		return bad("retryBackoffMax", "%v not in [retryBackoff, 1m]", p.RetryBackoffMax)
	case p.RetryBudgetPercent < 0 || p.RetryBudgetPercent > 100:
		return bad("retryBudgetPercent", "%d not in 0..100", p.RetryBudgetPercent)
	case p.RetryBudgetMinPerSecond < 0 || p.RetryBudgetMinPerSecond > 10000:
		return bad("retryBudgetMinPerSecond", "%d not in 0..10000", p.RetryBudgetMinPerSecond)
	case p.RetryBudgetWindow < time.Second || p.RetryBudgetWindow > time.Hour:
		return bad("retryBudgetWindow", "%v not in 1s..1h", p.RetryBudgetWindow)
	}
	for _, m := range p.Idempotent {
		if !strings.HasPrefix(m, "/") || strings.Count(m, "/") != 2 || strings.HasSuffix(m, "/") {
			return bad("idempotent", "%q is not /pkg.Service/Method or /pkg.Service/*", m)
		}
	}
	return nil
}

// IsIdempotent reports whether the policy names method as idempotent.
func (p *Policy) IsIdempotent(method string) bool {
	for _, m := range p.Idempotent {
		if m == method {
			return true
		}
		if svc, ok := strings.CutSuffix(m, "*"); ok && strings.HasPrefix(method, svc) {
			return true
		}
	}
	return false
}

// policyJSON is Policy on the wire: pointers tell a field left out (keep
// the default) from a zero.
type policyJSON struct {
	Picker                  *string   `json:"picker,omitempty"`
	SlowStartWindow         *duration `json:"slowStartWindow,omitempty"`
	ConsecutiveFailures     *int      `json:"consecutiveFailures,omitempty"`
	BaseEjection            *duration `json:"baseEjection,omitempty"`
	MaxEjection             *duration `json:"maxEjection,omitempty"`
	MaxEjectionPercent      *int      `json:"maxEjectionPercent,omitempty"`
	HalfOpenSuccesses       *int      `json:"halfOpenSuccesses,omitempty"`
	PanicThresholdPercent   *int      `json:"panicThresholdPercent,omitempty"`
	ZoneMinInstances        *int      `json:"zoneMinInstances,omitempty"`
	MaxRetries              *int      `json:"maxRetries,omitempty"`
	RetryBackoff            *duration `json:"retryBackoff,omitempty"`
	RetryBackoffMax         *duration `json:"retryBackoffMax,omitempty"`
	Idempotent              []string  `json:"idempotent,omitempty"`
	RetryBudgetPercent      *int      `json:"retryBudgetPercent,omitempty"`
	RetryBudgetMinPerSecond *int      `json:"retryBudgetMinPerSecond,omitempty"`
	RetryBudgetWindow       *duration `json:"retryBudgetWindow,omitempty"`
}

type duration time.Duration

func (d duration) MarshalJSON() ([]byte, error) { return json.Marshal(time.Duration(d).String()) }

func (d *duration) UnmarshalJSON(b []byte) error {
	var s string
	if err := json.Unmarshal(b, &s); err != nil {
		return fmt.Errorf("a duration is a string like \"30s\": %w", err)
	}
	v, err := time.ParseDuration(s)
	if err != nil {
		return err
	}
	*d = duration(v)
	return nil
}

// MarshalJSON writes every field.
func (p Policy) MarshalJSON() ([]byte, error) {
	dur := func(d time.Duration) *duration { v := duration(d); return &v }
	return json.Marshal(policyJSON{
		Picker: &p.Picker, SlowStartWindow: dur(p.SlowStartWindow),
		ConsecutiveFailures: &p.ConsecutiveFailures, BaseEjection: dur(p.BaseEjection),
		MaxEjection: dur(p.MaxEjection), MaxEjectionPercent: &p.MaxEjectionPercent,
		HalfOpenSuccesses: &p.HalfOpenSuccesses, PanicThresholdPercent: &p.PanicThresholdPercent,
		ZoneMinInstances: &p.ZoneMinInstances, MaxRetries: &p.MaxRetries, RetryBackoff: dur(p.RetryBackoff), RetryBackoffMax: dur(p.RetryBackoffMax),
		Idempotent: p.Idempotent, RetryBudgetPercent: &p.RetryBudgetPercent,
		RetryBudgetMinPerSecond: &p.RetryBudgetMinPerSecond, RetryBudgetWindow: dur(p.RetryBudgetWindow),
	})
}

// UnmarshalJSON sets the fields present and leaves the others as they
// were (unmarshal into DefaultPolicy() to get defaults for the rest).
// Unknown fields are refused: a misspelt field must not silently keep
// its default.
func (p *Policy) UnmarshalJSON(b []byte) error {
	var j policyJSON
	dec := json.NewDecoder(strings.NewReader(string(b)))
	dec.DisallowUnknownFields()
	if err := dec.Decode(&j); err != nil {
		return fmt.Errorf("%w: %w", ErrInvalidPolicy, err)
	}
	setS := func(dst *string, v *string) {
		if v != nil {
			*dst = *v
		}
	}
	setI := func(dst *int, v *int) {
		if v != nil {
			*dst = *v
		}
	}
	setD := func(dst *time.Duration, v *duration) {
		if v != nil {
			*dst = time.Duration(*v)
		}
	}
	setS(&p.Picker, j.Picker)
	setD(&p.SlowStartWindow, j.SlowStartWindow)
	setI(&p.ConsecutiveFailures, j.ConsecutiveFailures)
	setD(&p.BaseEjection, j.BaseEjection)
	setD(&p.MaxEjection, j.MaxEjection)
	setI(&p.MaxEjectionPercent, j.MaxEjectionPercent)
	setI(&p.HalfOpenSuccesses, j.HalfOpenSuccesses)
	setI(&p.PanicThresholdPercent, j.PanicThresholdPercent)
	setI(&p.ZoneMinInstances, j.ZoneMinInstances)
	setI(&p.MaxRetries, j.MaxRetries)
	setD(&p.RetryBackoff, j.RetryBackoff)
	setD(&p.RetryBackoffMax, j.RetryBackoffMax)
	if j.Idempotent != nil {
		p.Idempotent = j.Idempotent
	}
	setI(&p.RetryBudgetPercent, j.RetryBudgetPercent)
	setI(&p.RetryBudgetMinPerSecond, j.RetryBudgetMinPerSecond)
	setD(&p.RetryBudgetWindow, j.RetryBudgetWindow)
	return nil
}

// lbConfig is the parsed loadBalancingConfig entry.
type lbConfig struct {
	serviceconfig.LoadBalancingConfig `json:"-"`
	Policy
}

// ParsePolicy reads a loadBalancingConfig entry: the defaults overlaid
// with the fields present, then validated.
func ParsePolicy(js []byte) (Policy, error) {
	p := DefaultPolicy()
	if len(strings.TrimSpace(string(js))) == 0 {
		return p, nil
	}
	if err := json.Unmarshal(js, &p); err != nil {
		return Policy{}, err
	}
	if err := p.Validate(); err != nil {
		return Policy{}, err
	}
	return p, nil
}

// ServiceConfig returns a service config JSON that selects this balancer
// with p, for grpc.WithDefaultServiceConfig or a resolver's update.
func ServiceConfig(p Policy) (string, error) {
	if err := p.Validate(); err != nil {
		return "", err
	}
	b, err := json.Marshal(p)
	if err != nil {
		return "", fmt.Errorf("encode policy: %w", err)
	}
	return fmt.Sprintf(`{"loadBalancingConfig":[{%q:%s}]}`, Name, b), nil
}
