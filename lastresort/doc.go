// Package lastresort keeps the instances of a service that vanished by
// accident as a last resort, so a registry incident does not empty a
// caller's list while the backends are still up.
//
// An instance key lives on its lease, so when etcd stalls long enough to
// revoke leases, is restored from a snapshot, or is cut off from the
// instances, whole services vanish from the registry although every
// backend still answers. A deliberate removal is different: every
// deregistration and graceful close leaves a mark first (the record is
// written DRAINING, then deleted; see store.Deregister), so a delete whose
// last record seen was DRAINING is deliberate, and a delete of a record
// that was not is a vanishing.
//
// A Tracker is fed, per service, the list before and after each change,
// with the time. When the routable instances that vanished within
// Config.Window reach Config.Fraction of the routable instances the
// service had just before the first of them, it keeps them for
// Config.Grace, and Offer returns them, but only while the service's
// current list has no routable instance of its own. What it keeps is
// dropped at once, each, when a record with its id appears again (a
// re-registration), and all of them when the grace ends or when a
// deliberate removal of one of the service's instances is seen. A
// vanishing of a few instances among many never starts one.
//
// The Tracker reads no clock (time is an argument) and owns no goroutine:
// a caller that wants the end of a grace acted upon without a change calls
// Expire at Next. It is what both the SDK's resolver and the xDS server
// use, from whole per-service lists.
package lastresort
