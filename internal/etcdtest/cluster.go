package etcdtest

import (
	"context"
	"fmt"
	"io"
	"log/slog"
	"strings"
	"sync"
	"testing"
	"time"

	clientv3 "go.etcd.io/etcd/client/v3"

	"github.com/regcluster/registry/internal/embedded"
)

// Cluster is several embedded members of one etcd cluster whose peer links
// run through proxies, so a test can take quorum away and give it back.
type Cluster struct {
	Members []*Member
	// Peers[i] is the proxy every other member reaches member i through
	// (member i advertises it as its peer URL).
	Peers []*Proxy
}

// StartCluster runs an n-member cluster (fsync off) in temporary
// directories and waits until every member serves; it is closed when the
// test ends.
func StartCluster(t testing.TB, n int) *Cluster {
	t.Helper()
	c := &Cluster{Members: make([]*Member, n), Peers: make([]*Proxy, n)}
	cfgs := make([]embedded.Config, n)
	var initial []string
	for i := range n {
		listen := fmt.Sprintf("http://127.0.0.1:%d", FreePort(t))
		c.Peers[i] = NewProxy(t, listen)
		cfgs[i] = embedded.Config{
			Name: fmt.Sprintf("m%d", i), Dir: t.TempDir(),
			ListenClientURLs: []string{fmt.Sprintf("http://127.0.0.1:%d", FreePort(t))},
			ListenPeerURLs:   []string{listen}, AdvertisePeerURLs: []string{c.Peers[i].URL()},
			UnsafeNoFsync: true, LogLevel: "error", ProgressNotifyInterval: 500 * time.Millisecond,
			Logger: slog.New(slog.NewTextHandler(io.Discard, nil)),
		}
		initial = append(initial, cfgs[i].Name+"="+c.Peers[i].URL())
	}
	// Members become ready only together (each needs a quorum).
	var wg sync.WaitGroup
	errs := make([]error, n)
	for i := range n {
		cfgs[i].InitialCluster = strings.Join(initial, ",")
		cfgs[i].Token = "etcdtest"
		wg.Add(1)
		go func() {
			defer wg.Done()
			ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
			defer cancel()
			e, err := embedded.Start(ctx, cfgs[i])
			if err != nil {
				errs[i] = err
				return
			}
			c.Members[i] = &Member{Etcd: e, ClientURL: cfgs[i].ListenClientURLs[0], PeerURL: c.Peers[i].URL()}
		}()
	}
	wg.Wait()
	for i, m := range c.Members {
		if m != nil {
			t.Cleanup(m.Etcd.Close)
		}
		if errs[i] != nil {
			t.Fatalf("start cluster member %d: %v", i, errs[i])
		}
	}
	return c
}

// CutPeers cuts every peer link: no member hears another, so none keeps a
// leader (and with require-leader, etcd cancels their watches).
func (c *Cluster) CutPeers() {
	for _, p := range c.Peers {
		p.Cut()
	}
}

// HealPeers brings every peer link back.
func (c *Cluster) HealPeers() {
	for _, p := range c.Peers {
		p.Heal()
	}
}

// WaitLeader waits until every member reports the same leader, or fails
// the test after d.
func (c *Cluster) WaitLeader(t testing.TB, cli *clientv3.Client, d time.Duration) {
	t.Helper()
	deadline := time.Now().Add(d)
	for {
		var leader uint64
		agreed := true
		for _, m := range c.Members {
			ctx, cancel := context.WithTimeout(context.Background(), time.Second)
			st, err := cli.Status(ctx, m.ClientURL)
			cancel()
			if err != nil || st.Leader == 0 || (leader != 0 && st.Leader != leader) {
				agreed = false
				break
			}
			leader = st.Leader
		}
		if agreed {
			return
		}
		if time.Now().After(deadline) {
			t.Fatalf("no leader agreed by all %d members after %s", len(c.Members), d)
		}
		time.Sleep(50 * time.Millisecond)
	}
}
