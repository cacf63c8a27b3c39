// Package integration is the fault suite: a cluster of real regnode
// processes (each embedding one member of a three-member etcd cluster),
// workloads that register, drain, flap and subscribe, faults (kill, pause,
// partition, compaction, junk), and a history checker that proves the
// invariants of docs/architecture.md from what every subscriber showed and what etcd
// recorded, rather than from hand-picked asserts.
package integration
