// Package health is the hysteresis state machine that turns a stream of probe
// results into an instance's health state: HEALTHY, DEGRADED or UNAVAILABLE,
// plus UNKNOWN before the first result.
//
// The package is pure and deterministic: no I/O, no clock (the time of a
// result is an input), no goroutines. The same thresholds, starting state and
// results always give the same transitions, so the prober can resume a
// machine from the state stored in etcd and tests can replay sequences.
//
// The rules, with the defaults N=3, M=5, K=3, L=5 of Thresholds:
//
//	UNKNOWN     -> HEALTHY      on the first answer, if it is OK
//	UNKNOWN     -> DEGRADED     on the first answer, if it is slow
//	UNKNOWN     -> UNAVAILABLE  after N consecutive failures before any answer
//	HEALTHY     -> DEGRADED     after N consecutive failed or slow results
//	DEGRADED    -> UNAVAILABLE  after M consecutive failures (slow is not one)
//	DEGRADED    -> HEALTHY      after K consecutive OK results
//	UNAVAILABLE -> DEGRADED     after L consecutive responses (OK or slow)
//
// UNKNOWN is the state of an instance never seen healthy: failures keep it
// out of DEGRADED (which routes), so an instance that has not answered once
// is never routable. UNAVAILABLE never goes straight to HEALTHY, and every
// other transition is between adjacent states. Both counters restart from zero on every transition.
// Failures are the outcomes Timeout, Error and Unhealthy; a slow answer is a
// response, not a failure: it degrades a HEALTHY instance but never makes
// one UNAVAILABLE.
//
// Three things in this module are called health; this package is only the
// first:
//   - package health: an instance's health as the prober judges it (this
//     state machine), written into the record's Health field;
//   - registryv1.Health: that field of the record (state, since, reason,
//     latency, observer, fence), the only place the judgment is stored;
//   - grpc.health.v1: the standard gRPC health service, which regnode
//     serves for itself (is this regnode up) and which package probe's
//     gRPC check calls on an instance (kind GRPC).
package health
