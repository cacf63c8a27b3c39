// Package etcdtest starts real embedded etcd members for tests, on loopback
// ports chosen at random, and closes them when the test ends.
package etcdtest

import (
	"context"
	"fmt"
	"io"
	"log/slog"
	"net"
	"testing"
	"time"

	clientv3 "go.etcd.io/etcd/client/v3"
	"go.uber.org/goleak"

	"github.com/regcluster/registry/internal/embedded"
)

// FreePort returns a loopback port that was free a moment ago.
func FreePort(t testing.TB) int {
	t.Helper()
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatalf("free port: %v", err)
	}
	defer l.Close()
	return l.Addr().(*net.TCPAddr).Port
}

// Member is one running embedded etcd member.
type Member struct {
	Etcd      *embedded.Member
	ClientURL string
	PeerURL   string
}

// Start runs a single-member cluster in a temporary directory; fsync is off
// unless fsync is true.
func Start(t testing.TB, fsync bool) *Member {
	t.Helper()
	cu := fmt.Sprintf("http://127.0.0.1:%d", FreePort(t))
	pu := fmt.Sprintf("http://127.0.0.1:%d", FreePort(t))
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	e, err := embedded.Start(ctx, embedded.Config{
		Name: "test", Dir: t.TempDir(),
		ListenClientURLs: []string{cu}, ListenPeerURLs: []string{pu},
		UnsafeNoFsync: !fsync, LogLevel: "error",
		ProgressNotifyInterval: 500 * time.Millisecond,
		Logger:                 slog.New(slog.NewTextHandler(io.Discard, nil)),
	})
	if err != nil {
		t.Fatalf("start etcd: %v", err)
	}
	t.Cleanup(e.Close)
	return &Member{Etcd: e, ClientURL: cu, PeerURL: pu}
}

// Client returns a client of m that the test closes when it ends.
func (m *Member) Client(t testing.TB) *clientv3.Client {
	t.Helper()
	c, err := clientv3.New(clientv3.Config{Endpoints: []string{m.ClientURL}, DialTimeout: 5 * time.Second, Logger: QuietLogger()})
	if err != nil {
		t.Fatalf("etcd client: %v", err)
	}
	t.Cleanup(func() { c.Close() })
	return c
}

// LeakOptions are the goleak options for packages whose tests run embedded
// etcd: etcd's server and client keep a few process-wide goroutines that
// are not ours to stop.
func LeakOptions() []goleak.Option {
	return []goleak.Option{
		goleak.IgnoreTopFunction("go.opencensus.io/stats/view.(*worker).start"),
		goleak.IgnoreAnyFunction("github.com/golang/glog.(*fileSink).flushDaemon"),
		goleak.IgnoreAnyFunction("go.etcd.io/etcd/pkg/v3/logutil.(*MergeLogger).outputLoop"),
	}
}
