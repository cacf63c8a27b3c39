package record

import (
	"strings"
	"time"
	"unicode/utf8"

	"google.golang.org/protobuf/proto"
	"google.golang.org/protobuf/types/known/durationpb"

	registryv1 "github.com/regcluster/registry/proto/registry/v1"
)

// Limits of docs/architecture.md.
const (
	MaxServiceLen   = 63
	MaxIDLen        = 128
	MinWeight       = 1
	MaxWeight       = 1000
	DefaultWeight   = 100
	MaxMetadata     = 64
	MaxMetaKeyLen   = 63
	MaxMetaValueLen = 1024
	MaxRecordSize   = 16 * 1024
	MinTTL          = 2 * time.Second
	MaxTTL          = time.Hour
	DefaultTTL      = 10 * time.Second
	MaxZoneLen      = 63
	MaxVersionLen   = 128
	MaxReasonLen    = 1024
)

// ValidService reports why service is not a DNS-label-like service name
// (lowercase letters, digits, '-', '.', 1..63 characters, starting and ending
// with a letter or digit), or nil.
func ValidService(service string) error {
	if service == "" {
		return fieldErr("service", "must not be empty")
	}
	if len(service) > MaxServiceLen {
		return fieldErr("service", "%d characters, at most %d", len(service), MaxServiceLen)
	}
	for i := 0; i < len(service); i++ {
		c := service[i]
		if !(c >= 'a' && c <= 'z' || c >= '0' && c <= '9' || c == '-' || c == '.') {
			return fieldErr("service", "%q: only lowercase letters, digits, '-' and '.' are allowed", service)
		}
	}
	if !alnum(service[0]) || !alnum(service[len(service)-1]) {
		return fieldErr("service", "%q must start and end with a letter or digit", service)
	}
	return nil
}

func alnum(c byte) bool { return c >= 'a' && c <= 'z' || c >= '0' && c <= '9' }

// ValidID reports why id is not [A-Za-z0-9._-]{1,128}, or nil.
func ValidID(id string) error {
	if id == "" {
		return fieldErr("id", "must not be empty")
	}
	if len(id) > MaxIDLen {
		return fieldErr("id", "%d characters, at most %d", len(id), MaxIDLen)
	}
	for i := 0; i < len(id); i++ {
		c := id[i]
		if !(c >= 'a' && c <= 'z' || c >= 'A' && c <= 'Z' || c >= '0' && c <= '9' || c == '.' || c == '_' || c == '-') {
			return fieldErr("id", "%q: only letters, digits, '.', '_' and '-' are allowed", id)
		}
	}
	if id == "." || id == ".." {
		return fieldErr("id", "%q is not allowed", id)
	}
	return nil
}

// ValidTTL reports why a lease TTL is outside 2s..1h. Zero means the default
// and is valid.
func ValidTTL(ttl time.Duration) error {
	if ttl == 0 {
		return nil
	}
	if ttl < MinTTL || ttl > MaxTTL {
		return fieldErr("ttl", "%s is outside %s..%s", ttl, MinTTL, MaxTTL)
	}
	if ttl%time.Second != 0 {
		return fieldErr("ttl", "%s is not a whole number of seconds", ttl)
	}
	return nil
}

// Validate checks every rule of docs/architecture.md on an instance a client submits,
// and that it encodes (every string valid UTF-8), so that what it accepts
// every reader decodes. The first failure is returned as a *FieldError
// naming the field:
//
//   - service, id: see ValidService, ValidID; address: see ValidAddress;
//   - weight 1..1000, 0 meaning the default 100;
//   - zone (63 characters at most), version (128), metadata keys (63):
//     printable names, no control characters or spaces;
//   - metadata values (1 KiB at most) and lifecycle_reason (1 KiB): valid
//     UTF-8 text without control characters; at most 64 metadata entries;
//   - lifecycle and check.kind: known values; the check: see validCheck;
//   - the whole record at most 16 KiB.
func Validate(inst *registryv1.Instance) error {
	if inst == nil {
		return fieldErr("instance", "must be set")
	}
	if err := ValidService(inst.GetService()); err != nil {
		return err
	}
	if err := ValidID(inst.GetId()); err != nil {
		return err
	}
	if err := ValidAddress(inst.GetAddress()); err != nil {
		return err
	}
	if w := inst.GetWeight(); w != 0 && (w < MinWeight || w > MaxWeight) {
		return fieldErr("weight", "%d is outside %d..%d", w, MinWeight, MaxWeight)
	}
	if err := validName("zone", inst.GetZone(), MaxZoneLen); err != nil {
		return err
	}
	if err := validName("version", inst.GetVersion(), MaxVersionLen); err != nil {
		return err
	}
	if err := ValidReason(inst.GetLifecycleReason()); err != nil {
		return err
	}
	if n := len(inst.GetMetadata()); n > MaxMetadata {
		return fieldErr("metadata", "%d entries, at most %d", n, MaxMetadata)
	}
	for k, v := range inst.GetMetadata() {
		if err := ValidMetadata(k, v); err != nil {
			return err
		}
	}
	if _, ok := registryv1.Lifecycle_name[int32(inst.GetLifecycle())]; !ok {
		return fieldErr("lifecycle", "unknown value %d", inst.GetLifecycle())
	}
	if err := validCheck(inst.GetCheck()); err != nil {
		return err
	}
	// Fields a client does not set but a stored record holds: only what
	// encoding needs, so a prober's health write is never refused for
	// the text of a probe error.
	for _, s := range []struct{ field, v string }{
		{"health.reason", inst.GetHealth().GetReason()},
		{"health.observer", inst.GetHealth().GetObserver()},
		{"incarnation", inst.GetIncarnation()},
	} {
		if !utf8.ValidString(s.v) {
			return fieldErr(s.field, "not valid UTF-8")
		}
	}
	if n := proto.Size(inst); n > MaxRecordSize {
		return fieldErr("instance", "record is %d bytes, at most %d", n, MaxRecordSize)
	}
	return nil
}

// validName checks an optional name field of at most max characters.
func validName(field, v string, max int) error {
	if p := nameProblem(v); p != "" {
		return fieldErr(field, "%q: %s", v, p)
	}
	if n := utf8.RuneCountInString(v); n > max {
		return fieldErr(field, "%d characters, at most %d", n, max)
	}
	return nil
}

// ValidMetadata reports why k=v cannot be a metadata entry, or nil: the key
// a printable name of 1..63 characters without spaces, the value UTF-8 text
// of at most 1 KiB without control characters.
func ValidMetadata(k, v string) error {
	if k == "" {
		return fieldErr("metadata", "empty key")
	}
	if p := nameProblem(k); p != "" {
		return fieldErr("metadata", "key %q: %s", k, p)
	}
	if n := utf8.RuneCountInString(k); n > MaxMetaKeyLen {
		return fieldErr("metadata", "key %.20q... is %d characters, at most %d", k, n, MaxMetaKeyLen)
	}
	if len(v) > MaxMetaValueLen {
		return fieldErr("metadata", "value of %q is %d bytes, at most %d", k, len(v), MaxMetaValueLen)
	}
	if p := textProblem(v); p != "" {
		return fieldErr("metadata", "value of %q: %s", k, p)
	}
	return nil
}

// ValidReason reports why reason cannot be a lifecycle reason (the reason
// given to drain), or nil: UTF-8 text of at most 1 KiB without control
// characters.
func ValidReason(reason string) error {
	if len(reason) > MaxReasonLen {
		return fieldErr("lifecycle_reason", "%d bytes, at most %d", len(reason), MaxReasonLen)
	}
	if p := textProblem(reason); p != "" {
		return fieldErr("lifecycle_reason", "%s", p)
	}
	return nil
}

// MinCheckTimeout is the shortest probe timeout a check may ask for: below
// it every probe would time out before a connection could be made.
const MinCheckTimeout = time.Millisecond

// MinCheckInterval is the floor of a check's interval (from the seeds):
// probes never run closer than this.
const MinCheckInterval = 100 * time.Millisecond

// validCheck checks a health check spec: a known kind; a target only where
// the kind uses one (an HTTP path starting with '/', a gRPC service name;
// none for NONE and TCP, which connect to the address); durations valid,
// within 0..1h, an interval of at least 100ms, a timeout of at least 1ms
// and not longer than the interval (0 meaning the prober's default for
// each); thresholds at most 100.
func validCheck(c *registryv1.HealthCheck) error {
	if c == nil {
		return nil
	}
	target := c.GetTarget()
	if len(target) > MaxReasonLen {
		return fieldErr("check.target", "%d bytes, at most %d", len(target), MaxReasonLen)
	}
	switch c.GetKind() {
	case registryv1.CheckKind_CHECK_KIND_NONE, registryv1.CheckKind_CHECK_KIND_TCP:
		if target != "" {
			return fieldErr("check.target", "a %s check takes no target, got %q", kindName(c.GetKind()), target)
		}
	case registryv1.CheckKind_CHECK_KIND_HTTP:
		if target == "" || target[0] != '/' {
			return fieldErr("check.target", "an HTTP check needs a path starting with '/', got %q", target)
		}
		if p := nameProblem(target); p != "" {
			return fieldErr("check.target", "%q: %s", target, p)
		}
	case registryv1.CheckKind_CHECK_KIND_GRPC:
		if p := nameProblem(target); p != "" {
			return fieldErr("check.target", "%q: %s", target, p)
		}
	default:
		return fieldErr("check.kind", "unknown value %d", c.GetKind())
	}
	for _, d := range []struct {
		name string
		v    *durationpb.Duration
	}{
		{"check.interval", c.GetInterval()},
		{"check.timeout", c.GetTimeout()},
		{"check.slow_threshold", c.GetSlowThreshold()},
	} {
		if d.v == nil {
			continue
		}
		if err := d.v.CheckValid(); err != nil {
			return fieldErr(d.name, "%v", err)
		}
		if v := d.v.AsDuration(); v < 0 || v > time.Hour {
			return fieldErr(d.name, "%s is outside 0..1h", v)
		}
	}
	interval, timeout := c.GetInterval().AsDuration(), c.GetTimeout().AsDuration()
	if interval != 0 && interval < MinCheckInterval {
		return fieldErr("check.interval", "%s is below the %s floor", interval, MinCheckInterval)
	}
	if timeout != 0 && timeout < MinCheckTimeout {
		return fieldErr("check.timeout", "%s is below the %s floor", timeout, MinCheckTimeout)
	}
	if interval != 0 && timeout > interval {
		return fieldErr("check.timeout", "%s is longer than the interval %s", timeout, interval)
	}
	for _, t := range []struct {
		name string
		v    uint32
	}{
		{"check.failures_to_degraded", c.GetFailuresToDegraded()},
		{"check.failures_to_unavailable", c.GetFailuresToUnavailable()},
		{"check.successes_to_healthy", c.GetSuccessesToHealthy()},
		{"check.successes_to_degraded", c.GetSuccessesToDegraded()},
	} {
		if t.v > 100 {
			return fieldErr(t.name, "%d is above 100", t.v)
		}
	}
	return nil
}

// kindName is a check kind as a user writes it ("TCP").
func kindName(k registryv1.CheckKind) string {
	return strings.TrimPrefix(k.String(), "CHECK_KIND_")
}

// Normalize fills the defaults of a submitted instance: weight 100,
// lifecycle SERVING. It changes inst in place.
func Normalize(inst *registryv1.Instance) {
	if inst.Weight == 0 {
		inst.Weight = DefaultWeight
	}
	if inst.Lifecycle == registryv1.Lifecycle_LIFECYCLE_UNSPECIFIED {
		inst.Lifecycle = registryv1.Lifecycle_LIFECYCLE_SERVING
	}
}

// Routable reports whether callers may send inst new requests: lifecycle
// SERVING and health HEALTHY or DEGRADED, or UNKNOWN only when inst has no
// check (kind NONE: nothing will ever probe it). An instance with a check is
// not routable until its first successful probe (readiness semantics): one
// that fails its probes before ever answering goes from UNKNOWN straight to
// UNAVAILABLE, never through DEGRADED. DRAINING, STARTING and UNAVAILABLE
// instances are never routable.
func Routable(inst *registryv1.Instance) bool {
	if inst.GetLifecycle() != registryv1.Lifecycle_LIFECYCLE_SERVING {
		return false
	}
	switch inst.GetHealth().GetState() {
	case registryv1.HealthState_HEALTH_STATE_HEALTHY, registryv1.HealthState_HEALTH_STATE_DEGRADED:
		return true
	case registryv1.HealthState_HEALTH_STATE_UNKNOWN:
		return inst.GetCheck().GetKind() == registryv1.CheckKind_CHECK_KIND_NONE
	}
	return false
}

// EffectiveWeight is the weight a balancer should give inst: its weight
// (default 100), quartered while DEGRADED so it takes less traffic.
func EffectiveWeight(inst *registryv1.Instance) uint32 {
	w := inst.GetWeight()
	if w == 0 {
		w = DefaultWeight
	}
	if inst.GetHealth().GetState() == registryv1.HealthState_HEALTH_STATE_DEGRADED {
		w = max(1, w/4)
	}
	return w
}
