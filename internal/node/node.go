// Package node assembles one regnode: an embedded etcd member (or a client
// of an external etcd cluster), the registry.v1 API with gRPC health and
// reflection, and Prometheus metrics. Start brings it up; Close stops it
// cleanly: API streams closed, etcd closed, nothing lost.
//
// # Files
//
// config.go holds Config, DefaultConfig and Validate; start.go, Start;
// stop.go, Close and the servers' drain; prober.go, the prober's wiring
// (probe checker, prober, the election that sweeps orphaned states);
// sharding.go, sharded probing (membership, canaries, confirmations);
// peers.go, the announcement; auth.go,
// etcdauth.go, security.go and self.go, tokens, etcd credentials and TLS;
// limits.go, the API's limits; web.go, the HTTP API and the dashboard;
// dns.go, DNS (package dnsapi).
//
// # Stopping
//
// Every long-lived part is started through one stopper (package
// internal/stopper), which stops them in the reverse of the order Start
// started them, each cancelled, waited for, then closed; a failed Start
// stops what it started the same way. Reverse start order is dependency
// order: nothing closes while something started after it, and so possibly
// using it, still runs. Close's order, and why:
//
//  1. Quiesced, at once and before anything is waited for: the
//     announcement is revoked (peers' WaitApplied stop counting this
//     regnode: it is announced from before its API serves to here, so it
//     is counted for as long as it may have subscribers; and its share
//     of the probing moves to the others at once); the prober stops and
//     the prober election is resigned (another regnode takes the orphan
//     sweep over while this one drains, instead of a session TTL later); the fan-out hub stops,
//     which ends every Watch and Subscribe stream with "regnode is
//     stopping; resume on another" (so the API's graceful stop below waits
//     only for unary calls, and subscribers move at once); the HTTP API's
//     own connection to the gRPC API closes (ending its SSE watches).
//  2. Health turns NOT_SERVING (last started, so first in turn): health
//     checkers move away while the API still answers.
//  3. The HTTP server shuts down (ShutdownGrace), before the gRPC API its
//     JSON API calls; then DNS (queries in flight answered, connections
//     closed); then the gRPC API: calls in flight get ShutdownGrace,
//     then streams still open (KeepAlive) are closed.
//  4. What served those calls, now idle: the registration sweeper; the
//     announcement's and the election's goroutines (they return once
//     revoked and resigned, both bounded: the election's grant honours its
//     context, so a regnode whose etcd is unreachable still stops); the
//     token cache (not quiesced: the last calls are checked against the
//     tokens as they are); the probe checker (after the election, whose
//     prober used it); the hub's goroutine.
//  5. What the store writes through: the txn batcher; the lease pool, whose
//     idle leases are revoked while etcd is still there (no call is in
//     flight now, so they are nobody's); the lease renewer.
//  6. The etcd client, which every part above used; then the embedded
//     member (its WAL and backend flushed); then the data dir is unlocked.
package node

import (
	"log/slog"
	"net"
	"net/http"

	clientv3 "go.etcd.io/etcd/client/v3"
	"google.golang.org/grpc"
	grpchealth "google.golang.org/grpc/health"

	"github.com/regcluster/registry/dnsapi"
	"github.com/regcluster/registry/internal/embedded"
	"github.com/regcluster/registry/internal/fanout"
	"github.com/regcluster/registry/internal/leasepool"
	"github.com/regcluster/registry/internal/metrics"
	"github.com/regcluster/registry/internal/server"
	"github.com/regcluster/registry/internal/stopper"
	"github.com/regcluster/registry/internal/txnbatch"
	"github.com/regcluster/registry/probe"
	"github.com/regcluster/registry/prober"
	"github.com/regcluster/registry/xds"
)

// Version is the regnode version reported by Status.
const Version = "0.1.0"

// Node is a running regnode.
type Node struct {
	cfg     Config
	log     *slog.Logger
	etcd    *embedded.Member  // nil when external
	dataDir *embedded.DataDir // the embedded member's, held from Start to Close
	cli     *clientv3.Client
	grpc    *grpc.Server
	health  *grpchealth.Server
	lis     net.Listener
	metrics *metrics.Metrics
	hub     *fanout.Hub
	xds     *xds.Server
	renew   *leasepool.Renewer // every renewal, on one LeaseKeepAlive stream
	leases  *leasepool.Pool    // Register's leases, granted ahead
	commit  *txnbatch.Batcher  // Register's writes, group-committed
	probe   *probe.Checker
	prober  *prober.Prober
	shards  *sharding  // sharded probing (sharding.go)
	reports *reporting // callers' reports (reports.go)
	// peerSecret proves this regnode to its peers (server.PeerHeader).
	peerSecret string
	mhttp      *http.Server
	self       *selfListener     // the HTTP API's way in when the API serves TLS, or nil
	forward    *server.Forwarder // tells the gRPC API who called the HTTP API (web.go)
	mlis       net.Listener
	dns        *dnsapi.Server // nil unless DNS.Listen is set

	// life starts every long-lived part of the regnode and stops them,
	// in the order Close states; up says Start finished.
	life *stopper.Stopper
	up   bool
}

// Addr is the API's listening address.
func (n *Node) Addr() string { return n.lis.Addr().String() }

// MetricsAddr is where /metrics is served, or "" if disabled.
func (n *Node) MetricsAddr() string {
	if n.mlis == nil {
		return ""
	}
	return n.mlis.Addr().String()
}

// Name is this regnode's name.
func (n *Node) Name() string { return n.cfg.Name }

// Etcd is the regnode's etcd client (owned by the Node).
func (n *Node) Etcd() *clientv3.Client { return n.cli }

// Metrics are the node's counters.
func (n *Node) Metrics() *metrics.Metrics { return n.metrics }

// IdleLeases is how many leases the registration lease pool holds ready
// (granted ahead, attached to no key, revoked by Close).
func (n *Node) IdleLeases() int {
	if n.leases == nil {
		return 0
	}
	return n.leases.IdleTotal()
}

// XDS is the node's xDS server (package xds).
func (n *Node) XDS() *xds.Server { return n.xds }

// Hub is the node's subscription fan-out.
func (n *Node) Hub() *fanout.Hub { return n.hub }

// Embedded is the embedded etcd member, or nil when etcd is external.
func (n *Node) Embedded() *embedded.Member { return n.etcd }

// Err reports a server that stopped on its own (a listener failed) or an
// embedded etcd that failed; regnode exits on it.
func (n *Node) Err() <-chan error { return n.life.Err() }
