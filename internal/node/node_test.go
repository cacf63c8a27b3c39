package node_test

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

	"go.uber.org/goleak"
	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials/insecure"
	healthpb "google.golang.org/grpc/health/grpc_health_v1"

	"github.com/regcluster/registry/internal/embedded"
	"github.com/regcluster/registry/internal/etcdtest"
	"github.com/regcluster/registry/internal/node"
	"github.com/regcluster/registry/internal/tlsfiles"
	registryv1 "github.com/regcluster/registry/proto/registry/v1"
)

// Members of one cluster talk over HTTP (rafthttp); etcd leaves those idle
// peer connections to the runtime after Close, so they are not ours.
func TestMain(m *testing.M) {
	goleak.VerifyTestMain(m, append(etcdtest.LeakOptions(),
		goleak.IgnoreAnyFunction("net/http.(*persistConn).readLoop"),
		goleak.IgnoreAnyFunction("net/http.(*persistConn).writeLoop"),
		goleak.IgnoreAnyFunction("net/http.(*connReader).backgroundRead"),
		goleak.IgnoreAnyFunction("net/http.(*conn).serve"),
	)...)
}

// Three regnodes embed the three members of one etcd cluster: a write
// through one is read through another, and Status lists all three.
func TestThreeEmbeddedMembers(t *testing.T) {
	names := []string{"n1", "n2", "n3"}
	var nodes []*node.Node
	for attempt := 0; nodes == nil; attempt++ {
		var err error
		nodes, err = startCluster(t, names, nil)
		if err != nil && (!etcdtest.AddrInUse(err) || attempt == 4) {
			t.Fatal(err)
		}
	}
	conn := func(n *node.Node) *grpc.ClientConn {
		cc, err := grpc.NewClient(n.Addr(), grpc.WithTransportCredentials(insecure.NewCredentials()))
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { cc.Close() })
		return cc
	}
	ctx := context.Background()
	r1 := registryv1.NewRegistryClient(conn(nodes[0]))
	r3 := registryv1.NewRegistryClient(conn(nodes[2]))
	reg, err := r1.Register(ctx, &registryv1.RegisterRequest{Instance: &registryv1.Instance{Service: "orders", Id: "o-1", Address: "10.0.0.1:80"}})
	if err != nil {
		t.Fatal(err)
	}
	g, err := r3.Get(ctx, &registryv1.GetRequest{Service: "orders", Id: "o-1"})
	if err != nil || g.Instance.LeaseId != reg.LeaseId {
		t.Fatalf("get through n3 = %v, %v", g, err)
	}
	st, err := r3.Status(ctx, &registryv1.StatusRequest{})
	if err != nil {
		t.Fatal(err)
	}
	leaders := 0
	for _, m := range st.Members {
		if m.IsLeader {
			leaders++
		}
	}
	if len(st.Members) != 3 || leaders != 1 || st.Node != "n3" || !st.Embedded {
		t.Fatalf("status = %v", st)
	}
	// Closing one regnode (and its member) leaves the other two serving:
	// quorum holds.
	if err := nodes[0].Close(); err != nil {
		t.Fatal(err)
	}
	h, err := healthpb.NewHealthClient(conn(nodes[1])).Check(ctx, &healthpb.HealthCheckRequest{})
	if err != nil || h.Status != healthpb.HealthCheckResponse_SERVING {
		t.Fatalf("n2 health = %v, %v", h, err)
	}
	cctx, cancel := context.WithTimeout(ctx, 10*time.Second)
	defer cancel()
	if _, err := r3.Drain(cctx, &registryv1.DrainRequest{Service: "orders", Id: "o-1", Reason: "n1 down"}); err != nil {
		t.Fatalf("drain with one member down: %v", err)
	}
}

// A second node on the data dir of a running one is refused with
// ErrDataDirInUse (errors.Is), leaves the first one's files alone, and the
// first one goes on serving.
func TestDataDirInUseIsRefused(t *testing.T) {
	dir := t.TempDir()
	quiet := slog.New(slog.NewTextHandler(io.Discard, nil))
	cfg := func() node.Config {
		return node.Config{Listen: "127.0.0.1:0", MetricsListen: "off", Logger: quiet, ShutdownGrace: 200 * time.Millisecond,
			Embed: embedded.Config{Name: "n1", Dir: dir, UnsafeNoFsync: true,
				ListenClientURLs: []string{fmt.Sprintf("http://127.0.0.1:%d", etcdtest.FreePort(t))},
				ListenPeerURLs:   []string{fmt.Sprintf("http://127.0.0.1:%d", etcdtest.FreePort(t))}}}
	}
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	first, err := node.Start(ctx, cfg())
	if err != nil {
		t.Fatal(err)
	}
	defer first.Close()
	second, err := node.Start(ctx, cfg())
	if !errors.Is(err, embedded.ErrDataDirInUse) || !strings.Contains(err.Error(), dir) || !strings.Contains(err.Error(), embedded.LockFileName) {
		if second != nil {
			second.Close()
		}
		t.Fatalf("second node on %s: %v, want ErrDataDirInUse naming it and its lock", dir, err)
	}
	for _, f := range []string{embedded.LockFileName, "member/snap/db", "member/wal"} {
		if _, err := os.Stat(filepath.Join(dir, f)); err != nil {
			t.Errorf("the refused node touched the first one's %s: %v", f, err)
		}
	}
	if _, err := first.Etcd().Put(ctx, "still", "serving"); err != nil {
		t.Fatalf("first node after the refusal: %v", err)
	}
}

func TestConfigValidate(t *testing.T) {
	for _, c := range []node.Config{
		{Listen: "nope"},
		{Listen: "127.0.0.1:0", MetricsListen: "x"},
		{Listen: "127.0.0.1:0", SessionTTL: time.Second},
		{Listen: "127.0.0.1:0", Prefix: "relative/"},
		{Listen: "127.0.0.1:0", EtcdEndpoints: []string{" "}},
		{Listen: "127.0.0.1:0", Embed: embedded.Config{ClusterState: "maybe"}},
	} {
		if err := c.Validate(); err == nil {
			t.Errorf("%+v validated", c)
		}
	}
	def := node.DefaultConfig()
	if err := def.Validate(); err != nil {
		t.Fatalf("default config: %v", err)
	}
}

// startCluster starts one regnode per name, each embedding one member of
// the same etcd cluster, together (members wait for each other).
// startCluster runs one regnode per name, embedding the members of one
// cluster; peerTLS, if not nil, gives each member's peer TLS (https peer
// URLs).
func startCluster(t *testing.T, names []string, peerTLS func(name string) tlsfiles.Server) ([]*node.Node, error) {
	return startClusterWith(t, names, peerTLS, nil)
}

// startClusterWith is startCluster with mod, if not nil, applied to each
// regnode's Config.
func startClusterWith(t *testing.T, names []string, peerTLS func(name string) tlsfiles.Server, mod func(*node.Config)) ([]*node.Node, error) {
	peers := map[string]string{}
	clients := map[string]string{}
	var initial []string
	scheme := "http"
	if peerTLS != nil {
		scheme = "https"
	}
	for _, n := range names {
		peers[n] = fmt.Sprintf("%s://127.0.0.1:%d", scheme, etcdtest.FreePort(t))
		clients[n] = fmt.Sprintf("http://127.0.0.1:%d", etcdtest.FreePort(t))
		initial = append(initial, n+"="+peers[n])
	}
	quiet := slog.New(slog.NewTextHandler(io.Discard, nil))
	nodes := make([]*node.Node, len(names))
	errs := make([]error, len(names))
	var wg sync.WaitGroup
	for i, n := range names {
		wg.Add(1)
		var pt tlsfiles.Server
		if peerTLS != nil {
			pt = peerTLS(n)
		}
		go func() {
			defer wg.Done()
			ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
			defer cancel()
			cfg := node.Config{
				Listen: "127.0.0.1:0", MetricsListen: "off", Name: n, Logger: quiet, ShutdownGrace: 200 * time.Millisecond,
				Embed: embedded.Config{Name: n, Dir: t.TempDir(), ListenClientURLs: []string{clients[n]},
					ListenPeerURLs: []string{peers[n]}, InitialCluster: strings.Join(initial, ","), UnsafeNoFsync: true,
					ReadyTimeout: 20 * time.Second, PeerTLS: pt},
			}
			if mod != nil {
				mod(&cfg)
			}
			nodes[i], errs[i] = node.Start(ctx, cfg)
		}()
	}
	wg.Wait()
	if err := errors.Join(errs...); err != nil {
		for _, n := range nodes {
			if n != nil {
				n.Close()
			}
		}
		return nil, err
	}
	for _, n := range nodes {
		t.Cleanup(func() { n.Close() })
	}
	return nodes, nil
}
