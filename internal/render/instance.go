package render

import (
	"sort"
	"time"

	registryv1 "github.com/regcluster/registry/proto/registry/v1"
)

// Instance is the JSON form of a registry.v1.Instance, as `regctl get -o
// json` prints it, one element of `regctl list -o json`, and the
// "instance" of a watch put event.
type Instance struct {
	Service         string            `json:"service"`
	ID              string            `json:"id"`
	Address         string            `json:"address"`
	Zone            string            `json:"zone"`
	Version         string            `json:"version"`
	Weight          uint32            `json:"weight"`
	Metadata        map[string]string `json:"metadata"`
	Lifecycle       string            `json:"lifecycle"`
	LifecycleReason string            `json:"lifecycle_reason"`
	Health          Health            `json:"health"`
	Check           Check             `json:"check"`
	// LeaseID is the etcd lease the record is attached to, in hex.
	LeaseID        string    `json:"lease_id"`
	ModRevision    int64     `json:"mod_revision"`
	CreateRevision int64     `json:"create_revision"`
	RegisteredAt   time.Time `json:"registered_at,omitzero"`
	// Incarnation identifies the registration handle that wrote the record.
	Incarnation string `json:"incarnation,omitempty"`
}

// Health is the JSON form of the prober's last verdict on an instance. An
// instance never probed has state "UNKNOWN" and no since.
type Health struct {
	State  string    `json:"state"`
	Since  time.Time `json:"since,omitzero"`
	Reason string    `json:"reason"`
	// Observer is the regnode whose prober wrote this verdict.
	Observer string `json:"observer"`
	// Fence is the create revision of the leader key it was written under.
	Fence int64 `json:"fence"`
	// LatencyMS is the last probe's latency in milliseconds.
	LatencyMS float64 `json:"latency_ms"`
}

// Check is the JSON form of an instance's health check spec. Kind is "NONE"
// when the instance has no check; durations are Go durations ("500ms") and,
// like the thresholds, are left out when unset (the prober's default).
type Check struct {
	Kind                  string `json:"kind"`
	Target                string `json:"target,omitempty"`
	Interval              string `json:"interval,omitempty"`
	Timeout               string `json:"timeout,omitempty"`
	SlowThreshold         string `json:"slow_threshold,omitempty"`
	FailuresToDegraded    uint32 `json:"failures_to_degraded,omitempty"`
	FailuresToUnavailable uint32 `json:"failures_to_unavailable,omitempty"`
	SuccessesToHealthy    uint32 `json:"successes_to_healthy,omitempty"`
	SuccessesToDegraded   uint32 `json:"successes_to_degraded,omitempty"`
}

// NewInstance converts inst to its JSON form. A nil inst gives the zero
// Instance (with "UNKNOWN" health, "NONE" check and empty metadata).
func NewInstance(inst *registryv1.Instance) Instance {
	md := make(map[string]string, len(inst.GetMetadata()))
	for k, v := range inst.GetMetadata() {
		md[k] = v
	}
	h := inst.GetHealth()
	c := inst.GetCheck()
	return Instance{
		Service:         inst.GetService(),
		ID:              inst.GetId(),
		Address:         inst.GetAddress(),
		Zone:            inst.GetZone(),
		Version:         inst.GetVersion(),
		Weight:          inst.GetWeight(),
		Metadata:        md,
		Lifecycle:       Lifecycle(inst.GetLifecycle()),
		LifecycleReason: inst.GetLifecycleReason(),
		Health: Health{
			State:     HealthState(h.GetState()),
			Since:     timeOf(h.GetSince()),
			Reason:    h.GetReason(),
			Observer:  h.GetObserver(),
			Fence:     h.GetFence(),
			LatencyMS: float64(h.GetLastLatency().AsDuration()) / float64(time.Millisecond),
		},
		Check: Check{
			Kind:                  CheckKind(c.GetKind()),
			Target:                c.GetTarget(),
			Interval:              durationOf(c.GetInterval()),
			Timeout:               durationOf(c.GetTimeout()),
			SlowThreshold:         durationOf(c.GetSlowThreshold()),
			FailuresToDegraded:    c.GetFailuresToDegraded(),
			FailuresToUnavailable: c.GetFailuresToUnavailable(),
			SuccessesToHealthy:    c.GetSuccessesToHealthy(),
			SuccessesToDegraded:   c.GetSuccessesToDegraded(),
		},
		LeaseID:        HexID(uint64(inst.GetLeaseId())),
		ModRevision:    inst.GetModRevision(),
		CreateRevision: inst.GetCreateRevision(),
		RegisteredAt:   timeOf(inst.GetRegisteredAt()),
		Incarnation:    inst.GetIncarnation(),
	}
}

// NewInstances converts insts, sorted by service then id. The result is
// never nil, so it encodes as [] when there are none.
func NewInstances(insts []*registryv1.Instance) []Instance {
	out := make([]Instance, 0, len(insts))
	for _, inst := range insts {
		out = append(out, NewInstance(inst))
	}
	sort.SliceStable(out, func(i, j int) bool {
		if out[i].Service != out[j].Service {
			return out[i].Service < out[j].Service
		}
		return out[i].ID < out[j].ID
	})
	return out
}

// Since is when the instance last changed state as far as an operator
// cares: its health verdict's since, or, before any verdict, when it was
// registered. It is the zero time when neither is known.
func (i Instance) Since() time.Time {
	if !i.Health.Since.IsZero() {
		return i.Health.Since
	}
	return i.RegisteredAt
}
