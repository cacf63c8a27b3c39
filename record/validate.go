package record

import (
	"net"
	"strconv"
	"time"

	"google.golang.org/protobuf/proto"

	registryv1 "github.com/regcluster/registry/proto/registry/v1"
)

// Limits of DESIGN.md.
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

// ValidAddress reports why address is not host:port with port 1..65535.
func ValidAddress(address string) error {
	if address == "" {
		return fieldErr("address", "must not be empty")
	}
	host, port, err := net.SplitHostPort(address)
	if err != nil {
		return fieldErr("address", "%q is not host:port", address)
	}
	if host == "" {
		return fieldErr("address", "%q has no host", address)
	}
	p, err := strconv.Atoi(port)
	if err != nil || p < 1 || p > 65535 {
		return fieldErr("address", "%q: port must be 1..65535", address)
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

// Validate checks every rule of DESIGN.md on an instance a client submits.
// The first failure is returned as a *FieldError naming the field.
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
	if len(inst.GetZone()) > MaxZoneLen {
		return fieldErr("zone", "%d characters, at most %d", len(inst.GetZone()), MaxZoneLen)
	}
	if len(inst.GetVersion()) > MaxVersionLen {
		return fieldErr("version", "%d characters, at most %d", len(inst.GetVersion()), MaxVersionLen)
	}
	if len(inst.GetLifecycleReason()) > MaxReasonLen {
		return fieldErr("lifecycle_reason", "%d bytes, at most %d", len(inst.GetLifecycleReason()), MaxReasonLen)
	}
	if n := len(inst.GetMetadata()); n > MaxMetadata {
		return fieldErr("metadata", "%d entries, at most %d", n, MaxMetadata)
	}
	for k, v := range inst.GetMetadata() {
		if k == "" {
			return fieldErr("metadata", "empty key")
		}
		if len(k) > MaxMetaKeyLen {
			return fieldErr("metadata", "key %.20q... is %d characters, at most %d", k, len(k), MaxMetaKeyLen)
		}
		if len(v) > MaxMetaValueLen {
			return fieldErr("metadata", "value of %q is %d bytes, at most %d", k, len(v), MaxMetaValueLen)
		}
	}
	if _, ok := registryv1.Lifecycle_name[int32(inst.GetLifecycle())]; !ok {
		return fieldErr("lifecycle", "unknown value %d", inst.GetLifecycle())
	}
	if err := validCheck(inst.GetCheck()); err != nil {
		return err
	}
	if n := proto.Size(inst); n > MaxRecordSize {
		return fieldErr("instance", "record is %d bytes, at most %d", n, MaxRecordSize)
	}
	return nil
}

func validCheck(c *registryv1.HealthCheck) error {
	if c == nil {
		return nil
	}
	if _, ok := registryv1.CheckKind_name[int32(c.GetKind())]; !ok {
		return fieldErr("check.kind", "unknown value %d", c.GetKind())
	}
	if c.GetKind() == registryv1.CheckKind_CHECK_KIND_HTTP && (c.GetTarget() == "" || c.GetTarget()[0] != '/') {
		return fieldErr("check.target", "an HTTP check needs a path starting with '/', got %q", c.GetTarget())
	}
	if len(c.GetTarget()) > MaxReasonLen {
		return fieldErr("check.target", "%d bytes, at most %d", len(c.GetTarget()), MaxReasonLen)
	}
	for _, d := range []struct {
		name string
		v    interface {
			AsDuration() time.Duration
		}
		set bool
	}{
		{"check.interval", c.GetInterval(), c.Interval != nil},
		{"check.timeout", c.GetTimeout(), c.Timeout != nil},
		{"check.slow_threshold", c.GetSlowThreshold(), c.SlowThreshold != nil},
	} {
		if !d.set {
			continue
		}
		if v := d.v.AsDuration(); v < 0 || v > time.Hour {
			return fieldErr(d.name, "%s is outside 0..1h", v)
		}
	}
	if c.Interval != nil && c.GetInterval().AsDuration() != 0 && c.GetInterval().AsDuration() < 100*time.Millisecond {
		return fieldErr("check.interval", "%s is below the 100ms floor", c.GetInterval().AsDuration())
	}
	if c.Timeout != nil && c.Interval != nil && c.GetTimeout().AsDuration() > c.GetInterval().AsDuration() && c.GetInterval().AsDuration() != 0 {
		return fieldErr("check.timeout", "%s is longer than the interval %s", c.GetTimeout().AsDuration(), c.GetInterval().AsDuration())
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
