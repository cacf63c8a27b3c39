package balance

import (
	"sync/atomic"
	"time"

	"google.golang.org/grpc/balancer"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
)

// endpoint is one instance's passive state in one channel: it outlives
// pickers, and goes when the instance leaves the list.
type endpoint struct {
	key      string // the address
	owner    *lb
	inflight atomic.Int64
	picks    *atomic.Int64
	calls    atomic.Pointer[callCounts] // classified call ends, for callers' reports
	probing  atomic.Bool                // a half-open call is in flight

	// fails is the count of consecutive instance-level failures. It is
	// written only under owner.ejectMu but read without it: a success on
	// an endpoint whose count is 0 changes nothing, so Done returns at
	// once, with no lock and no clock (the common case of every call).
	fails atomic.Int32

	// Guarded by owner.ejectMu.
	inst        Instance
	ejected     bool      //
	until       time.Time // end of the current ejection
	ejections   int       // recent ejections: the next lasts this many times BaseEjection
	returned    time.Time // when it last came back
	okInRow     int       // half-open successes in a row
	recoveredAt time.Time // start of the local slow start after a return
}

// outcome sorts a finished call for outlier detection.
type outcome int

const (
	neutral outcome = iota // says nothing of the instance (the caller cancelled)
	success                // the instance answered, whatever the application said
	failure                // the instance is sick or unreachable
)

// classify says whether a call's end blames the instance. Only codes that
// the instance or its transport produce when it is unwell count as
// failures: an application error (InvalidArgument, NotFound,
// PermissionDenied, FailedPrecondition, ...) is a healthy instance
// answering (seed 001: a 400 must not eject).
func classify(err error) outcome {
	if err == nil {
		return success
	}
	switch status.Code(err) {
	case codes.Unavailable, codes.DeadlineExceeded, codes.ResourceExhausted:
		return failure
	case codes.Canceled:
		return neutral
	}
	return success
}

// done applies one finished call to ep's outlier state: consecutive
// failures eject (at most MaxEjectionPercent of the instances at once),
// for BaseEjection × recent ejections, capped at MaxEjection; after that
// one call at a time goes through (half-open, seed 001's
// RECOVER_THRESHOLD) and HalfOpenSuccesses in a row bring it back, with a
// local slow start; a failure ejects it again, for longer.
func (b *lb) done(ep *endpoint, sh *shared, di balancer.DoneInfo, probe bool) {
	o := classify(di.Err)
	if c := ep.calls.Load(); c != nil && o != neutral {
		if o == success {
			c.ok.Add(1)
		} else {
			c.fail.Add(1)
		}
	}
	if o == neutral {
		if probe {
			ep.probing.Store(false)
		}
		return
	}
	if o == success && !probe && ep.fails.Load() == 0 {
		// What the locked path would do is set fails to 0 (or nothing,
		// for an ejected endpoint, whose count is 0 since its ejection):
		// done already.
		return
	}
	p := &sh.policy
	var event func()
	b.ejectMu.Lock()
	id := ep.inst.ID // for the log, read under the lock
	switch {
	case probe && o == success:
		ep.okInRow++
		if ep.okInRow >= p.HalfOpenSuccesses {
			now := time.Now()
			ep.ejected, ep.okInRow = false, 0
			if c := ep.calls.Load(); c != nil {
				c.ejected.Store(false)
			}
			ep.fails.Store(0)
			ep.returned, ep.recoveredAt = now, now
			event = func() {
				sh.metrics.returns.Add(1)
				sh.log.Info("instance back from ejection", "service", sh.service, "id", id, "address", ep.key,
					"reason", "half-open calls succeeded", "successes", p.HalfOpenSuccesses)
			}
		}
		ep.probing.Store(false)
	case probe: // a half-open call failed: eject again, for longer
		ep.okInRow = 0
		ep.ejections++
		d := ejectionTime(p, ep.ejections)
		ep.until = time.Now().Add(d)
		ep.probing.Store(false)
		code, msg := status.Code(di.Err), status.Convert(di.Err).Message()
		event = func() {
			sh.metrics.ejections.Add(1)
			sh.log.Warn("instance ejected again", "service", sh.service, "id", id, "address", ep.key,
				"for", d, "reason", "half-open call failed", "code", code.String(), "error", msg)
		}
	case ep.ejected:
		// A call picked before the picker changed, or in panic mode.
	case o == success:
		ep.fails.Store(0)
	default:
		n := int(ep.fails.Add(1))
		if n < p.ConsecutiveFailures {
			break
		}
		ep.fails.Store(0)
		ejected := 0
		for _, e := range b.eps {
			if e.ejected {
				ejected++
			}
		}
		code, msg := status.Code(di.Err), status.Convert(di.Err).Message()
		if (ejected+1)*100 > p.MaxEjectionPercent*b.nInst {
			event = func() {
				sh.metrics.ejectionsCapped.Add(1)
				sh.log.Warn("instance not ejected: too many ejected already", "service", sh.service, "id", id,
					"address", ep.key, "ejected", ejected, "max_percent", p.MaxEjectionPercent,
					"consecutive_failures", n, "code", code.String(), "error", msg)
			}
			break
		}
		now := time.Now() // the clock only for an ejection decision
		if now.Sub(ep.returned) > p.MaxEjection {
			ep.ejections = 0 // long healthy since its last return: start over
		}
		ep.ejections++
		d := ejectionTime(p, ep.ejections)
		ep.ejected, ep.until, ep.okInRow = true, now.Add(d), 0
		if c := ep.calls.Load(); c != nil {
			c.ejected.Store(true)
		}
		event = func() {
			sh.metrics.ejections.Add(1)
			sh.log.Warn("instance ejected", "service", sh.service, "id", id, "address", ep.key, "for", d,
				"reason", "consecutive failures", "failures", n, "code", code.String(), "error", msg)
		}
	}
	b.ejectMu.Unlock()
	if event != nil {
		event()
		b.poke()
	}
}

func ejectionTime(p *Policy, n int) time.Duration {
	return min(p.BaseEjection*time.Duration(n), p.MaxEjection)
}
