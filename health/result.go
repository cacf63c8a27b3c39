package health

import (
	"fmt"
	"strconv"
	"time"
)

// Outcome is the kind of one probe result. Its String is the lower-case
// name ("ok", "slow", "timeout", "error", "unhealthy"), usable as a metric
// label.
type Outcome int

// The outcomes. The zero Outcome is none of them: a Machine counts an
// invalid outcome as an Error, so a Result left unset can never pass for a
// success.
const (
	// OK: the target answered healthy within the slow threshold.
	OK Outcome = iota + 1
	// Slow: the target answered healthy, but slower than the slow
	// threshold. It degrades a HEALTHY instance; it is not a failure.
	Slow
	// Timeout: no answer before the probe's timeout.
	Timeout
	// Error: the probe could not reach the target (connection refused or
	// reset, DNS, a broken protocol...).
	Error
	// Unhealthy: the target answered that it is not healthy (HTTP non-2xx,
	// gRPC NOT_SERVING, no health service...).
	Unhealthy
)

// String returns the outcome's lower-case name.
func (o Outcome) String() string {
	switch o {
	case OK:
		return "ok"
	case Slow:
		return "slow"
	case Timeout:
		return "timeout"
	case Error:
		return "error"
	case Unhealthy:
		return "unhealthy"
	}
	return "outcome(" + strconv.Itoa(int(o)) + ")"
}

// Failure reports whether o counts as a failure: Timeout, Error, Unhealthy,
// or an invalid outcome. OK and Slow are responses, not failures.
func (o Outcome) Failure() bool { return o != OK && o != Slow }

// Result is one probe result, as the prober measured it.
type Result struct {
	// Outcome is what kind of result this is.
	Outcome Outcome
	// Latency is how long the probe took, measured with the monotonic clock.
	Latency time.Duration
	// Detail says what happened, for a person: "connection refused",
	// "HTTP 503", "NOT_SERVING", "timeout after 500ms". It may be empty
	// for OK.
	Detail string
	// At is when the result was observed. The Machine takes it as the time
	// of any transition the result causes.
	At time.Time
}

// Classify returns r with an OK result whose latency is strictly above slow
// turned into Slow, its Detail saying by how much ("took 180ms, over the
// 100ms slow threshold"). Any other result, and any result when slow is not
// above zero, is returned unchanged. Classify is idempotent.
func Classify(r Result, slow time.Duration) Result {
	if r.Outcome == OK && slow > 0 && r.Latency > slow {
		r.Outcome = Slow
		r.Detail = fmt.Sprintf("took %s, over the %s slow threshold", FormatDuration(r.Latency), FormatDuration(slow))
	}
	return r
}

// FormatDuration renders d for people: rounded to the millisecond from 1ms
// up, to the microsecond below.
func FormatDuration(d time.Duration) string {
	if d >= time.Millisecond || d <= -time.Millisecond {
		return d.Round(time.Millisecond).String()
	}
	return d.Round(time.Microsecond).String()
}
