// Package etcdtest starts real embedded etcd members for tests, on loopback
// ports chosen at random, and closes them when the test ends.
package etcdtest

import (
	"context"
	"fmt"
	"io"
	"log/slog"
	"math/rand/v2"
	"net"
	"strings"
	"testing"
	"time"

	clientv3 "go.etcd.io/etcd/client/v3"
	"go.uber.org/goleak"
	"golang.org/x/crypto/bcrypt"

	"github.com/regcluster/registry/internal/embedded"
)

// FreePort returns a loopback port that was free a moment ago. It picks at
// random below Linux's ephemeral range (32768-60999), which is where the
// kernel hands out port 0 listeners and outgoing connections: picks there
// collide with other test processes far more often.
func FreePort(t testing.TB) int {
	t.Helper()
	for range 100 {
		port := 20000 + rand.IntN(12000)
		l, err := net.Listen("tcp", fmt.Sprintf("127.0.0.1:%d", port))
		if err != nil {
			continue
		}
		l.Close()
		return port
	}
	t.Fatal("no free port found below 32000")
	return 0
}

// Member is one running embedded etcd member.
type Member struct {
	Etcd      *embedded.Member
	ClientURL string
	PeerURL   string
}

// Start runs a single-member cluster in a temporary directory; fsync is off
// unless fsync is true. Ports are picked at random; a port taken by another
// test process between picking and binding is retried with new ones.
func Start(t testing.TB, fsync bool) *Member {
	t.Helper()
	var last error
	for range 5 {
		cu := fmt.Sprintf("http://127.0.0.1:%d", FreePort(t))
		pu := fmt.Sprintf("http://127.0.0.1:%d", FreePort(t))
		ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
		e, err := embedded.Start(ctx, embedded.Config{
			Name: "test", Dir: t.TempDir(),
			ListenClientURLs: []string{cu}, ListenPeerURLs: []string{pu},
			UnsafeNoFsync: !fsync, LogLevel: "error",
			BcryptCost:             bcrypt.MinCost, // authentication tests stay fast under -race
			ProgressNotifyInterval: 500 * time.Millisecond,
			Logger:                 slog.New(slog.NewTextHandler(io.Discard, nil)),
		})
		cancel()
		if err == nil {
			t.Cleanup(e.Close)
			return &Member{Etcd: e, ClientURL: cu, PeerURL: pu}
		}
		if !AddrInUse(err) {
			t.Fatalf("start etcd: %v", err)
		}
		last = err
	}
	t.Fatalf("start etcd: %v", last)
	return nil
}

// AddrInUse reports a failure to bind a port someone else took.
func AddrInUse(err error) bool {
	return err != nil && strings.Contains(err.Error(), "address already in use")
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
