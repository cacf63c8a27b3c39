package health

import (
	"strconv"
	"strings"
)

// The reasons of transitions. They are built only from the results that
// caused the transition, and always name the kind of the last ones, so a
// person can tell timeouts from refused connections from unhealthy answers.

// plural names n results of outcome o: "3 timeouts", "1 error".
func plural(n int, o Outcome) string {
	var one, many string
	switch o {
	case Slow:
		one, many = "slow response", "slow responses"
	case Timeout:
		one, many = "timeout", "timeouts"
	case Unhealthy:
		one, many = "unhealthy answer", "unhealthy answers"
	default:
		one, many = "error", "errors"
	}
	if n == 1 {
		return "1 " + one
	}
	return strconv.Itoa(n) + " " + many
}

// failureReason describes the failure run that just completed: one kind
// ("3 consecutive timeouts after 500ms", "5 consecutive unhealthy answers:
// HTTP 503"), or a mix, counted by kind, with the last result ("5
// consecutive failures (2 timeouts, 3 errors), last error: connection
// refused").
func (m *Machine) failureReason() string {
	last := m.lastBad
	if m.failures == 1 {
		return describe(last)
	}
	var parts []string
	kinds, slow := 0, false
	for _, o := range []Outcome{Slow, Timeout, Error, Unhealthy} {
		if n := m.byOutcome[o]; n > 0 {
			kinds++
			slow = slow || o == Slow
			parts = append(parts, plural(n, o))
		}
	}
	n := strconv.Itoa(m.failures)
	if kinds == 1 {
		head := n + " consecutive " + strings.TrimPrefix(plural(m.failures, last.Outcome), n+" ")
		if last.Outcome == Timeout {
			if rest, ok := strings.CutPrefix(last.Detail, "timeout "); ok {
				return head + " " + rest
			}
		}
		return joinDetail(head, last.Detail)
	}
	noun := "failures"
	if slow {
		noun = "failed or slow probes"
	}
	return n + " consecutive " + noun + " (" + strings.Join(parts, ", ") + "), last " + describe(last)
}

// describe names r's kind with its detail: "timeout after 500ms", "error:
// connection refused", "unhealthy: HTTP 503", "slow: took 180ms, over the
// 100ms slow threshold".
func describe(r Result) string {
	switch r.Outcome {
	case Timeout:
		if strings.HasPrefix(r.Detail, "timeout") {
			return r.Detail
		}
		return joinDetail("timeout", r.Detail)
	case OK:
		return joinDetail("ok", r.Detail)
	}
	return joinDetail(r.Outcome.String(), r.Detail)
}

// firstVerb completes "first probe ..." for a first result that is not OK.
func firstVerb(r Result) string {
	switch r.Outcome {
	case Timeout:
		return "timed out" + strings.TrimPrefix(describe(r), "timeout")
	case Slow:
		return joinDetail("slow", r.Detail)
	case Unhealthy:
		return joinDetail("unhealthy", r.Detail)
	}
	return joinDetail("failed", r.Detail)
}

func successReason(n int) string {
	if n == 1 {
		return "probe succeeded"
	}
	return strconv.Itoa(n) + " consecutive successes"
}

func responseReason(n, slow int) string {
	s := "a response after being unavailable"
	if n > 1 {
		s = strconv.Itoa(n) + " consecutive responses after being unavailable"
	}
	if slow > 0 {
		s += " (" + plural(slow, Slow) + ")"
	}
	return s
}

// joinDetail returns "head: detail", or head alone when detail is empty.
func joinDetail(head, detail string) string {
	if detail == "" {
		return head
	}
	return head + ": " + detail
}
