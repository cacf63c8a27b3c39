package health

import (
	"time"

	registryv1 "github.com/regcluster/registry/proto/registry/v1"
)

// Shorter names for the four states, used throughout the package.
const (
	unknown     = registryv1.HealthState_HEALTH_STATE_UNKNOWN
	healthy     = registryv1.HealthState_HEALTH_STATE_HEALTHY
	degraded    = registryv1.HealthState_HEALTH_STATE_DEGRADED
	unavailable = registryv1.HealthState_HEALTH_STATE_UNAVAILABLE
)

// Transition is one change of state, caused by the result observed At.
type Transition struct {
	From, To registryv1.HealthState
	// At is the At of the result that caused the transition.
	At time.Time
	// Reason says why, for a person, from the results that caused it:
	// "3 consecutive timeouts after 500ms", "first probe failed:
	// connection refused", "3 consecutive successes".
	Reason string
}

// String renders t as "HEALTHY -> DEGRADED: reason", for logs.
func (t Transition) String() string {
	return stateName(t.From) + " -> " + stateName(t.To) + ": " + t.Reason
}

// Machine is the health state of one instance and the runs of results that
// will move it. It is a value: copying a Machine copies its whole state.
// Create it with NewMachine (the zero Machine is UNKNOWN with every count at
// 1 and no slow detection). A Machine is not safe for concurrent use; the
// prober owns one per instance.
type Machine struct {
	t      Thresholds
	state  registryv1.HealthState
	since  time.Time
	reason string

	failures  int // the current run of failed (or, in HEALTHY, slow) results
	successes int // the current run of OK (or, in UNAVAILABLE, slow) results

	// The failure run's results by outcome, and its last result: what the
	// reason of a transition on failures is built from.
	byOutcome [Unhealthy + 1]int
	lastBad   Result
	slowInRun int // slow responses in the success run (UNAVAILABLE only)
}

// NewMachine returns a machine in state since the given time, with empty
// runs: the prober resumes from the state etcd holds. A state outside the
// enum starts as UNKNOWN. NewMachine does not validate t; a count below 1
// acts as 1 and a Slow not above zero disables slow detection in Observe.
func NewMachine(t Thresholds, state registryv1.HealthState, since time.Time) Machine {
	switch state {
	case healthy, degraded, unavailable:
	default:
		state = unknown
	}
	return Machine{t: t, state: state, since: since}
}

// State returns the current state.
func (m Machine) State() registryv1.HealthState { return m.state }

// Since returns when the current state began: the At of the result that
// caused the last transition, or the time given to NewMachine.
func (m Machine) Since() time.Time { return m.since }

// Reason returns the reason of the last transition, empty if there was none
// since NewMachine.
func (m Machine) Reason() string { return m.reason }

// Thresholds returns the thresholds the machine applies.
func (m Machine) Thresholds() Thresholds { return m.t }

// Counters returns the current consecutive runs: failures counts toward
// leaving HEALTHY (failed or slow results), DEGRADED downwards or UNKNOWN
// (failures only); successes counts toward leaving DEGRADED upwards (OK
// results) or UNAVAILABLE (OK or slow results). Both are zero right after a transition.
func (m Machine) Counters() (failures, successes int) { return m.failures, m.successes }

// Observe applies one result and returns the transition it caused, if the
// state changed. An OK result slower than the machine's Slow threshold is
// first classified as Slow (see Classify); an invalid Outcome counts as an
// Error. Observe is deterministic: it reads no clock, only r.
func (m *Machine) Observe(r Result) (Transition, bool) {
	if r.Outcome < OK || r.Outcome > Unhealthy {
		r.Detail = joinDetail("invalid probe "+r.Outcome.String(), r.Detail)
		r.Outcome = Error
	}
	r = Classify(r, m.t.Slow)

	switch m.state {
	case healthy:
		if r.Outcome == OK {
			m.success(r)
			return Transition{}, false
		}
		m.failure(r)
		if m.failures >= atLeast1(m.t.FailuresToDegraded) {
			return m.move(degraded, r, m.failureReason())
		}
	case degraded:
		switch {
		case r.Outcome == OK:
			m.success(r)
			if m.successes >= atLeast1(m.t.SuccessesToHealthy) {
				return m.move(healthy, r, successReason(m.successes))
			}
		case r.Outcome == Slow:
			// A response, so not a failure; not a success either.
			m.resetRuns()
		default:
			m.failure(r)
			if m.failures >= atLeast1(m.t.FailuresToUnavailable) {
				return m.move(unavailable, r, m.failureReason())
			}
		}
	case unavailable:
		if r.Outcome.Failure() {
			m.failure(r)
			return Transition{}, false
		}
		m.success(r)
		if m.successes >= atLeast1(m.t.SuccessesToDegraded) {
			return m.move(degraded, r, responseReason(m.successes, m.slowInRun))
		}
	default:
		// UNKNOWN: never seen healthy (not probed yet, or never answered).
		// The first answer decides; failures before it never make the
		// instance DEGRADED (which routes): after N of them in a row it is
		// UNAVAILABLE, like a readiness probe that never passed.
		switch r.Outcome {
		case OK:
			return m.move(healthy, r, "first probe ok")
		case Slow:
			return m.move(degraded, r, "first probe "+firstVerb(r))
		}
		m.failure(r)
		if m.failures >= atLeast1(m.t.FailuresToDegraded) {
			if m.failures == 1 {
				return m.move(unavailable, r, "first probe "+firstVerb(r))
			}
			return m.move(unavailable, r, "never healthy: "+m.failureReason())
		}
	}
	return Transition{}, false
}

// failure extends the failure run with r and ends the success run.
func (m *Machine) failure(r Result) {
	if m.failures == 0 {
		m.byOutcome = [Unhealthy + 1]int{}
	}
	m.failures++
	m.byOutcome[r.Outcome]++
	m.lastBad = r
	m.successes, m.slowInRun = 0, 0
}

// success extends the success run with r and ends the failure run.
func (m *Machine) success(r Result) {
	m.successes++
	if r.Outcome == Slow {
		m.slowInRun++
	}
	m.failures = 0
}

func (m *Machine) resetRuns() {
	m.failures, m.successes, m.slowInRun = 0, 0, 0
}

// move makes the transition to state to, caused by r, and resets both runs.
func (m *Machine) move(to registryv1.HealthState, r Result, reason string) (Transition, bool) {
	tr := Transition{From: m.state, To: to, At: r.At, Reason: reason}
	m.state, m.since, m.reason = to, r.At, reason
	m.resetRuns()
	m.byOutcome = [Unhealthy + 1]int{}
	m.lastBad = Result{}
	return tr, true
}

func atLeast1(n int) int { return max(n, 1) }

func stateName(s registryv1.HealthState) string {
	switch s {
	case unknown:
		return "UNKNOWN"
	case healthy:
		return "HEALTHY"
	case degraded:
		return "DEGRADED"
	case unavailable:
		return "UNAVAILABLE"
	}
	return s.String()
}
