// Package regnodetest runs real regnodes inside a test: each embeds its own
// etcd member (or uses one the test started) on loopback ports chosen at
// random, and is closed when the test ends.
package regnodetest

import (
	"context"
	"fmt"
	"io"
	"log/slog"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	clientv3 "go.etcd.io/etcd/client/v3"

	"github.com/regcluster/registry/internal/embedded"
	"github.com/regcluster/registry/internal/epoch"
	"github.com/regcluster/registry/internal/etcdtest"
	"github.com/regcluster/registry/internal/node"
	"github.com/regcluster/registry/record"
)

// Regnode is one running regnode.
type Regnode struct {
	// Node is the regnode itself.
	Node *node.Node
	// Addr is its API address.
	Addr string
	// Etcd is a separate client of the same etcd, for reading etcd
	// directly in assertions.
	Etcd *clientv3.Client
	// ClientURL is the etcd client URL the regnode uses.
	ClientURL string
	// Prefix is the key prefix.
	Prefix string
}

// Start runs a regnode that embeds a fresh single-member etcd.
func Start(t testing.TB) *Regnode {
	t.Helper()
	for attempt := 0; ; attempt++ {
		cu := fmt.Sprintf("http://127.0.0.1:%d", etcdtest.FreePort(t))
		pu := fmt.Sprintf("http://127.0.0.1:%d", etcdtest.FreePort(t))
		rn, err := start(t, node.Config{Embed: embedded.Config{
			Name: "rn", Dir: t.TempDir(), ListenClientURLs: []string{cu}, ListenPeerURLs: []string{pu},
			UnsafeNoFsync: true, LogLevel: "error", ProgressNotifyInterval: 500 * time.Millisecond,
		}}, cu)
		if err == nil {
			return rn
		}
		if !etcdtest.AddrInUse(err) || attempt == 4 {
			t.Fatalf("start regnode: %v", err)
		}
	}
}

// StartExternal runs a regnode that is a client of the etcd at clientURL.
func StartExternal(t testing.TB, clientURL string) *Regnode {
	t.Helper()
	return StartWith(t, node.Config{EtcdEndpoints: []string{clientURL}}, clientURL)
}

// StartWith runs a regnode of cfg (API and metrics on random loopback ports
// unless cfg says otherwise); clientURL is its etcd's client URL.
func StartWith(t testing.TB, cfg node.Config, clientURL string) *Regnode {
	t.Helper()
	rn, err := start(t, cfg, clientURL)
	if err != nil {
		t.Fatalf("start regnode: %v", err)
	}
	return rn
}

// names numbers the regnodes of external etcds that the test did not
// name: several on one etcd must not share a name (the default is
// host/listen address, the same "127.0.0.1:0" for all), or settle would
// take another's candidacy for its own and a later write of theirs
// would land inside a test's before-and-after.
var names atomic.Int64

func start(t testing.TB, cfg node.Config, clientURL string) (*Regnode, error) {
	if cfg.Name == "" && len(cfg.EtcdEndpoints) > 0 {
		cfg.Name = fmt.Sprintf("rn-%d", names.Add(1))
	}
	if cfg.Listen == "" {
		cfg.Listen = "127.0.0.1:0"
	}
	if cfg.MetricsListen == "" {
		cfg.MetricsListen = "127.0.0.1:0"
	}
	if cfg.Logger == nil {
		cfg.Logger = slog.New(slog.NewTextHandler(io.Discard, nil))
	}
	if cfg.ShutdownGrace == 0 {
		cfg.ShutdownGrace = 500 * time.Millisecond
	}
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	n, err := node.Start(ctx, cfg)
	if err != nil {
		return nil, err
	}
	t.Cleanup(func() {
		if err := n.Close(); err != nil {
			t.Errorf("close regnode: %v", err)
		}
	})
	cli, err := clientv3.New(clientv3.Config{Endpoints: []string{clientURL}, DialTimeout: 5 * time.Second, Logger: etcdtest.QuietLogger()})
	if err != nil {
		return nil, fmt.Errorf("etcd client: %w", err)
	}
	t.Cleanup(func() { cli.Close() })
	prefix := cfg.Prefix
	if prefix == "" {
		prefix = record.DefaultPrefix
	}
	rn := &Regnode{Node: n, Addr: n.Addr(), Etcd: cli, ClientURL: clientURL, Prefix: prefix}
	if err := rn.settle(ctx); err != nil {
		return nil, err
	}
	return rn, nil
}

// WaitRevision waits until the regnode's fan-out has applied revision
// rev, so that a Watch or List it serves from now on holds every write up
// to rev (the fan-out follows etcd a moment behind a write's answer). It
// fails t after a minute: only a broken regnode takes that long.
func (rn *Regnode) WaitRevision(t testing.TB, rev int64) {
	t.Helper()
	deadline := time.Now().Add(time.Minute)
	for rn.Node.Hub().Revision() < rev {
		if time.Now().After(deadline) {
			t.Fatalf("regnode %s: the fan-out is at revision %d, never reached %d", rn.Node.Name(), rn.Node.Hub().Revision(), rev)
		}
		time.Sleep(5 * time.Millisecond)
	}
}

// settle waits for the writes a regnode makes by itself on start, its
// epoch key and its candidacy in the prober's election, so that a test
// comparing etcd's revision before and after a call sees only the call's
// writes.
func (rn *Regnode) settle(ctx context.Context) error {
	keys := record.NewKeys(rn.Prefix)
	want := fmt.Sprintf("%q", rn.Node.Name())
	for {
		ep, err := rn.Etcd.Get(ctx, epoch.Key(rn.Prefix), clientv3.WithCountOnly())
		if err != nil {
			return fmt.Errorf("regnode %s settling: read its epoch key: %w", rn.Node.Name(), err)
		}
		el, err := rn.Etcd.Get(ctx, keys.Election()+"/", clientv3.WithPrefix())
		if err != nil {
			return fmt.Errorf("regnode %s settling: read the election: %w", rn.Node.Name(), err)
		}
		candidate := false
		for _, kv := range el.Kvs {
			candidate = candidate || strings.Contains(string(kv.Value), `"name":`+want)
		}
		if ep.Count == 1 && candidate {
			return nil
		}
		select {
		case <-ctx.Done():
			return fmt.Errorf("regnode %s never wrote its epoch key and candidacy: %w", rn.Node.Name(), ctx.Err())
		case <-time.After(10 * time.Millisecond):
		}
	}
}
