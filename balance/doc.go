// Package balance is the registry's gRPC load-balancing policy (Name,
// "registry_weighted") and the retry interceptor that goes with it: the
// client half of the registry's promise, deciding whether a request
// actually succeeds once the list of instances is right.
//
// It is built on grpc-go's pieces, not beside them: balancer/endpointsharding
// keeps one pickfirst child per endpoint (with the health listener
// enabled) and owns every connection; this package only chooses among the
// READY children. The resolver (package client) sets an Instance on each
// resolver.Endpoint's attributes, never on the addresses, so a change of
// weight or health reaches the picker without a reconnect, and a Service
// on the state's attributes, so the balancer can tell "no list yet" from
// "nobody registered" from "everybody draining". Passive signals come
// from PickResult.Done.
//
// # Picking
//
// Weighted power of two choices, least request (default, PickerP2C): a
// candidate is drawn with probability proportional to its weight, a
// second one likewise among the others, and the second wins only with
// fewer in-flight calls per unit of weight (seed 004's active/weight
// score). A tie keeps the first, itself a weighted random draw, so an
// idle channel splits by weight exactly in expectation, while under load
// every pick compares two distinct instances and moves calls off one that
// answers slowly. Both draws are O(1) (an alias table). Smooth weighted
// round robin (PickerWRR, nginx's algorithm) is the option for exact
// shares: its order over one cycle is computed when the picker is built
// and the picks take turns by an atomic cursor (a golden-ratio sequence
// over the weights when the cycle is too long to keep). No pick takes a
// lock, and the Done of a call that succeeds on an instance with no
// recorded failure takes none, reads no clock and allocates nothing;
// only failures and ejected instances take the outlier lock. The weight is the registry's, reduced while DEGRADED
// (record.EffectiveWeight: a quarter). DRAINING instances are never
// picked.
//
// # Defaults and why
//
//   - SlowStartWindow 30s (seed 001): an instance that becomes routable gets
//     5%, 25%, 50% then 100% of its weight, a third of the window each. The
//     start is routable_since from the record, written by the registry, so
//     every client ramps an instance in step instead of each from the
//     moment it noticed; a return from a client-side ejection ramps from
//     the local return time.
//   - ConsecutiveFailures 5, BaseEjection 30s, MaxEjection 300s,
//     MaxEjectionPercent 50, HalfOpenSuccesses 2 (seed 001's FAIL_THRESHOLD
//     and RECOVER_THRESHOLD, Envoy's consecutive_5xx, base_ejection_time and
//     max_ejection_percent). Five in a row keeps one slow call from
//     ejecting; the n-th recent ejection lasts n × 30s so a flapping
//     instance stays out longer; the 50% cap keeps one client's view of a
//     common downstream's failure from ejecting a whole service. Only
//     Unavailable, DeadlineExceeded and ResourceExhausted (the codes of a
//     sick instance and of connection errors) count; an application code
//     (InvalidArgument, NotFound, PermissionDenied, FailedPrecondition, ...)
//     is a healthy instance answering and resets the count. After the
//     ejection, one call at a time goes through (half-open); two successes
//     bring the instance back, a failure ejects it again for longer.
//   - PanicThresholdPercent 50 (Envoy's healthy_panic_threshold, seed 004's
//     "explicit degraded decision"): when healthy instances (routable and
//     not ejected) are fewer than half of the registered, non-draining
//     ones, calls spread over every non-draining instance, UNAVAILABLE and
//     ejected included, rather than piling onto the few left. Entering and
//     leaving is logged once and counted.
//   - Zone-aware routing, with a caller zone (client.Config.Zone), after
//     Envoy's rule: if the caller's zone holds at least its callers' share
//     of the healthy weight, every call stays in the zone; otherwise only
//     (zone's share / callers' share) of the calls do and the rest spill
//     over to the other zones by weight. The callers' share is taken as
//     even over the zones the service runs in, since a client does not see
//     the other callers. ZoneMinInstances 6 (Envoy's min_cluster_size):
//     with fewer healthy instances the shares are too coarse, and calls go
//     by weight alone. Panic mode turns zone routing off.
//   - MaxRetries 2 (seed 001: one or two), RetryBackoff 10ms up to 100ms,
//     jittered: a retry goes to an instance not yet tried for the call, so
//     it need not wait for the first one to recover. By default only what
//     certainly was not processed is retried (no instance picked, or no
//     byte sent); methods listed in Idempotent also retry Unavailable and
//     DeadlineExceeded. Every attempt shares the caller's deadline (seed
//     004: a fresh timeout per attempt multiplies the caller's wait).
//   - RetryBudgetPercent 20 over RetryBudgetWindow 10s plus
//     RetryBudgetMinPerSecond 3 (Finagle's RetryBudget): when a whole
//     service fails, retries add at most a fifth to its load instead of
//     tripling it; the floor keeps a quiet channel able to retry at all.
//
// # Nothing to call
//
// Before the first view of the service (Service.Known false, neither
// Unreached nor Refused) the channel is CONNECTING and picks queue, as
// behind any resolver that has not answered yet. A pick that cannot be
// served fails at once with codes.Unavailable and a message that says
// why: "orders: registry not reached yet and no cached list" (the
// registry was not reached within the client's connect timeout, which is
// not an empty list), "no instance of orders
// is registered", "all 3 instances of orders are draining", or which
// instances exist and that none of the routable ones is connected.
package balance
