// Package cache is a regnode's local view of the registry: every instance
// under the prefix, as of one etcd revision.
//
// The view is an immutable Snapshot behind an atomic pointer. A writer (the
// watcher) hands the Cache one Batch at a time; Apply builds the next
// Snapshot copy-on-write, per service: only the services the batch touches
// get a new version, every other service keeps its own by pointer, and the
// small top-level map is copied. Readers never take a lock and never see a
// half-applied batch: a Snapshot, once published, never changes.
//
// Each service is a persistent B+tree sorted by id (leaves of up to 64
// instances), so a batch of k changes to a service of N instances copies
// O(k × log N) of it, not all N: a large service that receives one batch
// per registration stays cheap to update. Snapshot.Instances returns one
// flat slice per version of a service, built by the first read of that
// version and shared by every later one; Count, Get and Each read the tree
// itself and never build it.
//
// The cache is revision-monotonic (invariants 1 and 2 of docs/architecture.md):
//
//   - an incremental batch at a revision at or below the cache's is refused
//     with ErrStale and changes nothing;
//   - a progress batch (no events) only ever moves the revision up;
//   - a snapshot batch replaces everything (instances missing from it are
//     removed, and the returned Diff says so) and may not be older than the
//     cache, except when it opens a new etcd epoch (Batch.NewEpoch: etcd was
//     restored or replaced), the one case where the revision may go down.
//
// So every Snapshot the cache publishes is a state that existed in etcd at
// the revision it carries, provided the batches it was given were.
package cache
