package prober

import (
	"container/heap"
	"fmt"
	"time"

	"github.com/regcluster/registry/cache"
	"github.com/regcluster/registry/health"
	registryv1 "github.com/regcluster/registry/proto/registry/v1"
)

// reportsReason starts the reason of a DEGRADED written because of
// callers' reports; a new owner recognizes it on taking over.
const reportsReason = "failing calls from "

// Nudge asks the prober to probe service/id at once, if it is in its
// share: callers report it failing. It never blocks; a nudge that finds
// the prober busy is dropped (the instance is probed at its interval).
func (p *Prober) Nudge(service, id string) {
	select {
	case p.nudges <- cache.Key{Service: service, ID: id}:
	default:
	}
}

// nudge moves key's next probe to now, unless it is in flight.
func (f *follower) nudge(key cache.Key, now time.Time) bool {
	t := f.all[key]
	if t == nil || t.idx < 0 || t.gone {
		return false
	}
	t.nextAt = now
	heap.Fix(f.due, t.idx)
	return true
}

// byReports applies callers' reports to t after a probe (res) that left
// its machine unchanged: while its probes pass (machine HEALTHY) and at
// least ReportQuorum distinct callers see its calls fail while their
// calls to its peers succeed, its record says DEGRADED with that reason;
// once the reports clear, HEALTHY again. Reports never make an instance
// UNAVAILABLE, and say nothing while the probes themselves fail.
func (p *Prober) byReports(w *writer, t *tracked, res health.Result, s *Share) {
	if p.cfg.Reported == nil {
		return
	}
	if t.machine.State() != registryv1.HealthState_HEALTH_STATE_HEALTHY || res.Outcome.Failure() {
		return
	}
	n := p.cfg.Reported(t.inst.Service, t.inst.Id)
	switch {
	case n >= p.cfg.ReportQuorum && !t.byReports:
		t.byReports = true
		p.submit(w, t, health.Transition{From: registryv1.HealthState_HEALTH_STATE_HEALTHY, To: registryv1.HealthState_HEALTH_STATE_DEGRADED,
			At: res.At, Reason: fmt.Sprintf("%s%d clients; probes pass", reportsReason, n)}, res, s)
	case n < p.cfg.ReportQuorum && t.byReports:
		t.byReports = false
		p.submit(w, t, health.Transition{From: registryv1.HealthState_HEALTH_STATE_DEGRADED, To: registryv1.HealthState_HEALTH_STATE_HEALTHY,
			At: res.At, Reason: "callers' reports cleared; probes pass"}, res, s)
	}
}
