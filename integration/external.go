package integration

import (
	"context"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"

	clientv3 "go.etcd.io/etcd/client/v3"
	"go.uber.org/zap"

	"github.com/regcluster/registry/internal/embedded"
)

// Member is one member of an etcd cluster run in the test process, for
// regnodes that use an external etcd.
type Member struct {
	cfg embedded.Config
	mu  sync.Mutex
	m   *embedded.Member
}

// Stop closes the member (its data stays); Start brings it back.
func (m *Member) Stop() {
	m.mu.Lock()
	defer m.mu.Unlock()
	if m.m != nil {
		m.m.Close()
		m.m = nil
	}
}

// Start starts the member on its data; it waits until it has rejoined.
func (m *Member) Start(t testing.TB) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	e, err := embedded.Start(ctx, m.cfg)
	if err != nil {
		t.Fatalf("start member %s: %v", m.cfg.Name, err)
	}
	m.mu.Lock()
	m.m = e
	m.mu.Unlock()
}

// StartExternalCluster runs an n-member etcd cluster in the test process
// and n regnodes (processes) that are its clients and embed nothing.
func StartExternalCluster(t testing.TB, bin string, n int, env ...string) (*Cluster, []*Member) {
	t.Helper()
	var members []*Member
	var initial, clients []string
	quiet := slog.New(slog.NewTextHandler(io.Discard, nil))
	for i := range n {
		name := fmt.Sprintf("e%d", i+1)
		cu := fmt.Sprintf("http://127.0.0.1:%d", freePort(t))
		pu := fmt.Sprintf("http://127.0.0.1:%d", freePort(t))
		members = append(members, &Member{cfg: embedded.Config{Name: name, Dir: filepath.Join(t.TempDir(), name),
			ListenClientURLs: []string{cu}, ListenPeerURLs: []string{pu}, UnsafeNoFsync: true, Logger: quiet,
			ProgressNotifyInterval: 500 * time.Millisecond}})
		initial = append(initial, name+"="+pu)
		clients = append(clients, cu)
	}
	var wg sync.WaitGroup
	errs := make([]error, n)
	for i, m := range members {
		m.cfg.InitialCluster = strings.Join(initial, ",")
		wg.Add(1)
		go func() { // members wait for each other
			defer wg.Done()
			ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
			defer cancel()
			e, err := embedded.Start(ctx, m.cfg)
			errs[i] = err
			m.m = e
		}()
	}
	wg.Wait()
	for _, m := range members {
		t.Cleanup(m.Stop)
	}
	if err := errors.Join(errs...); err != nil {
		t.Fatalf("start etcd cluster: %v", err)
	}
	c := &Cluster{t: t, bin: bin}
	for i := range n {
		nd := &Node{Name: fmt.Sprintf("x%d", i+1), dir: t.TempDir(),
			API:     fmt.Sprintf("127.0.0.1:%d", freePort(t)),
			Metrics: fmt.Sprintf("127.0.0.1:%d", freePort(t))}
		nd.env = append(append(os.Environ(),
			"REGNODE_NAME="+nd.Name, "REGNODE_LISTEN="+nd.API, "REGNODE_METRICS_LISTEN="+nd.Metrics,
			"REGNODE_ETCD_ENDPOINTS="+strings.Join(clients, ","),
			"REGNODE_SESSION_TTL=2s", "REGNODE_PROBE_INTERVAL=100ms", "REGNODE_LOG_LEVEL=warn",
			"REGNODE_SHUTDOWN_GRACE=500ms"), env...)
		c.Nodes = append(c.Nodes, nd)
		c.start(nd)
	}
	t.Cleanup(c.stopAll)
	for _, nd := range c.Nodes {
		c.WaitServing(nd)
	}
	cli, err := clientv3.New(clientv3.Config{Endpoints: clients, DialTimeout: 2 * time.Second, Logger: zap.NewNop()})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { cli.Close() })
	c.Etcd = cli
	return c, members
}
