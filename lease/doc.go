// Package lease keeps a registration alive: it registers an instance under
// an etcd lease, renews the lease, and when the lease is lost (expired during
// a partition, revoked behind its back, etcd restored without it) registers
// the same instance id again by itself, with backoff and jitter, for as long
// as the Keeper is open. It never gives up after N retries.
//
// The Keeper owns its renewal loop and reads every renewal itself, so etcd's
// "keepalive response queue is full" cannot happen. Closing is graceful:
// lifecycle DRAINING is written first, the drain grace period lets
// subscribers see it, then the key is deleted and the lease revoked.
//
// The loop is written once, against a Backend: store.NewLeaseBackend talks
// to etcd directly (any Go program holding an etcd client); the SDK
// supplies a Backend that goes through regnode's API. Package lease itself
// imports nothing of etcd, so the SDK does not link it.
//
// The errors callers branch on (errors.Is): ErrClosed (a Keeper's
// methods after Close) and ErrLeaseLost (the Backend's contract for a
// lease that no longer exists); a Backend's record.ErrInvalid and
// record.ErrAlreadyExists make Start fail at once instead of retrying.
package lease
