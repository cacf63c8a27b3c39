// Package node assembles one regnode: an embedded etcd member (or a client
// of an external etcd cluster), the registry.v1 API with gRPC health and
// reflection, and Prometheus metrics. Start brings it up; Close stops it
// cleanly: API streams closed, etcd closed, nothing lost.
package node

import (
	"context"
	"log/slog"
	"net"
	"net/http"
	"sync"

	clientv3 "go.etcd.io/etcd/client/v3"
	"google.golang.org/grpc"
	grpchealth "google.golang.org/grpc/health"

	"github.com/regcluster/registry/internal/embedded"
	"github.com/regcluster/registry/internal/fanout"
	"github.com/regcluster/registry/internal/leasepool"
	"github.com/regcluster/registry/internal/metrics"
	"github.com/regcluster/registry/internal/txnbatch"
	"github.com/regcluster/registry/probe"
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
	stopHub context.CancelFunc
	renew   *leasepool.Renewer // every renewal, on one LeaseKeepAlive stream
	leases  *leasepool.Pool    // Register's leases, granted ahead
	commit  *txnbatch.Batcher  // Register's writes, group-committed
	probe   *probe.Checker
	stopEl  context.CancelFunc
	elDone  chan struct{}
	mhttp   *http.Server
	self    *selfListener // the HTTP API's way in when the API serves TLS, or nil
	mlis    net.Listener

	stopAuth context.CancelFunc // stops the token cache's watch, or nil

	wg        sync.WaitGroup
	closeOnce sync.Once
	closeErr  error
	done      chan struct{}
	serveErr  chan error
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

// Hub is the node's subscription fan-out.
func (n *Node) Hub() *fanout.Hub { return n.hub }

// Embedded is the embedded etcd member, or nil when etcd is external.
func (n *Node) Embedded() *embedded.Member { return n.etcd }

// Err reports a server that stopped on its own (a listener failed) or an
// embedded etcd that failed; regnode exits on it.
func (n *Node) Err() <-chan error { return n.serveErr }
