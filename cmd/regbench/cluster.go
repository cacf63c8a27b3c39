package main

import (
	"context"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net"
	"os"
	"path/filepath"
	"runtime/pprof"
	"strings"
	"sync/atomic"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	clientv3 "go.etcd.io/etcd/client/v3"
	"go.uber.org/zap"
	"go.uber.org/zap/zapcore"

	"github.com/regcluster/registry/client"
	"github.com/regcluster/registry/internal/embedded"
	"github.com/regcluster/registry/internal/node"
	"github.com/regcluster/registry/internal/peerlimit"
)

// Every goroutine of the process runs under a pprof label "side" saying
// whose work it is: the embedded etcd, the regnode, the subscribers
// ("client"), or the benchmark's writer. Goroutines inherit the label of
// the goroutine that starts them, so starting each component under its
// label is enough; fanout reads CPU by label from a profile.
const (
	sideEtcd    = "etcd"
	sideRegnode = "regnode"
	sideClient  = "client"
	sideWriter  = "writer"
)

// labeled runs f (and every goroutine it starts) under the side label.
func labeled(side string, f func()) {
	pprof.Do(context.Background(), pprof.Labels("side", side), func(context.Context) { f() })
}

// quiet is the logger of every component: regbench prints its own results.
func quiet(verbose bool) *slog.Logger {
	if verbose {
		return slog.New(slog.NewTextHandler(os.Stderr, &slog.HandlerOptions{Level: slog.LevelWarn}))
	}
	return slog.New(slog.NewTextHandler(io.Discard, nil))
}

// childLog is the logger of a child process's SDK clients: none, or with
// REGBENCH_CHILD_LOG=PREFIX, every record (debug included) of each child
// in the file PREFIX.PID, to see why streams end under load.
func childLog() *slog.Logger {
	prefix := os.Getenv("REGBENCH_CHILD_LOG")
	if prefix == "" {
		return quiet(false)
	}
	f, err := os.Create(fmt.Sprintf("%s.%d", prefix, os.Getpid()))
	if err != nil {
		return quiet(false)
	}
	return slog.New(slog.NewTextHandler(f, &slog.HandlerOptions{Level: slog.LevelDebug}))
}

// freePort returns a loopback port that was free a moment ago.
func freePort() (int, error) {
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return 0, err
	}
	defer l.Close()
	return l.Addr().(*net.TCPAddr).Port, nil
}

// etcdServer is one embedded single-member etcd in a temporary directory.
type etcdServer struct {
	m   *embedded.Member
	URL string
	dir string
}

// startEtcd starts a member on random loopback ports; fsync is off unless
// asked (it does not change what a watcher sees, only how fast writes land).
func startEtcd(ctx context.Context, e *env, fsync bool) (*etcdServer, error) {
	dir, err := os.MkdirTemp("", "regbench-etcd-")
	if err != nil {
		return nil, err
	}
	var last error
	for attempt := range 5 {
		cp, err1 := freePort()
		pp, err2 := freePort()
		if err := errors.Join(err1, err2); err != nil {
			os.RemoveAll(dir)
			return nil, err
		}
		cu := fmt.Sprintf("http://127.0.0.1:%d", cp)
		pu := fmt.Sprintf("http://127.0.0.1:%d", pp)
		var m *embedded.Member
		labeled(sideEtcd, func() {
			m, err = embedded.Start(ctx, embedded.Config{
				Name: "bench", Dir: filepath.Join(dir, fmt.Sprint(attempt)),
				ListenClientURLs: []string{cu}, ListenPeerURLs: []string{pu},
				UnsafeNoFsync: !fsync, LogLevel: "error", Logger: e.log,
			})
		})
		if err == nil {
			return &etcdServer{m: m, URL: cu, dir: dir}, nil
		}
		last = err
		if !strings.Contains(err.Error(), "address already in use") {
			break
		}
	}
	os.RemoveAll(dir)
	return nil, fmt.Errorf("start etcd: %w", last)
}

func (s *etcdServer) Close() {
	s.m.Close()
	os.RemoveAll(s.dir)
}

// startNode runs a regnode in-process on the given etcd endpoints.
func startNode(ctx context.Context, e *env, endpoints []string, mod func(*node.Config)) (*node.Node, error) {
	cfg := node.Config{EtcdEndpoints: endpoints, Listen: "127.0.0.1:0", MetricsListen: "off",
		Logger: e.log, ShutdownGrace: 500 * time.Millisecond,
		// The scenarios measure the registry's cost from one host
		// (16,000 registrations, 10,000 subscribers): no per-peer limits.
		Limits: peerlimit.Unlimited()}
	if mod != nil {
		mod(&cfg)
	}
	var (
		n   *node.Node
		err error
	)
	labeled(sideRegnode, func() { n, err = node.Start(ctx, cfg) })
	if err != nil {
		return nil, fmt.Errorf("start regnode: %w", err)
	}
	return n, nil
}

// etcdClient returns a client of endpoint whose goroutines run under side.
// core, if set, receives the client's log entries (to count them).
func etcdClient(side, endpoint string, core zapcore.Core) (*clientv3.Client, error) {
	lg := zap.NewNop()
	if core != nil {
		lg = zap.New(core)
	}
	var (
		c   *clientv3.Client
		err error
	)
	labeled(side, func() {
		c, err = clientv3.New(clientv3.Config{Endpoints: []string{endpoint}, DialTimeout: 5 * time.Second,
			Logger: lg, MaxCallRecvMsgSize: 64 << 20})
	})
	if err != nil {
		return nil, fmt.Errorf("etcd client of %s: %w", endpoint, err)
	}
	return c, nil
}

// regClient returns an SDK client of the regnode addresses.
func regClient(e *env, addrs ...string) (*client.Client, error) {
	var (
		c   *client.Client
		err error
	)
	labeled(sideClient, func() { c, err = client.New(client.Config{Endpoints: addrs, Logger: e.log}) })
	return c, err
}

// etcdWatchers reads etcd's own gauges from the process-wide Prometheus
// registry, where the embedded server registers them: the number of
// watchers and of watch streams etcd holds (across every member of the
// process; scenarios run one etcd at a time and take differences).
func etcdWatchers() (watchers, streams int) {
	mfs, err := prometheus.DefaultGatherer.Gather()
	if err != nil {
		return -1, -1
	}
	for _, mf := range mfs {
		if len(mf.Metric) == 0 {
			continue
		}
		v := int(mf.Metric[0].GetGauge().GetValue())
		switch mf.GetName() {
		case "etcd_debugging_mvcc_watcher_total":
			watchers = v
		case "etcd_debugging_mvcc_watch_stream_total":
			streams = v
		}
	}
	return watchers, streams
}

// etcdRanges is the number of Range calls etcd's gRPC server has started
// (grpc_server_started_total{grpc_method="Range"}), from the same registry.
func etcdRanges() float64 {
	mfs, err := prometheus.DefaultGatherer.Gather()
	if err != nil {
		return -1
	}
	for _, mf := range mfs {
		if mf.GetName() != "grpc_server_started_total" {
			continue
		}
		for _, m := range mf.Metric {
			for _, l := range m.GetLabel() {
				if l.GetName() == "grpc_method" && l.GetValue() == "Range" {
					return m.GetCounter().GetValue()
				}
			}
		}
	}
	return -1
}

// countingCore is a zap core that counts entries whose message contains a
// string (for "watch failed" in etcd's naming package).
type countingCore struct {
	zapcore.LevelEnabler
	match string
	n     *atomic.Int64
}

func newCountingCore(match string) *countingCore {
	return &countingCore{LevelEnabler: zapcore.DebugLevel, match: match, n: &atomic.Int64{}}
}

func (c *countingCore) With([]zapcore.Field) zapcore.Core { return c }
func (c *countingCore) Check(e zapcore.Entry, ce *zapcore.CheckedEntry) *zapcore.CheckedEntry {
	if strings.Contains(e.Message, c.match) {
		return ce.AddCore(e, c)
	}
	return ce
}
func (c *countingCore) Write(zapcore.Entry, []zapcore.Field) error { c.n.Add(1); return nil }
func (c *countingCore) Sync() error                                { return nil }

// waitFor polls cond every d until it holds or ctx ends.
func waitFor(ctx context.Context, d time.Duration, cond func() bool) error {
	t := time.NewTicker(d)
	defer t.Stop()
	for !cond() {
		select {
		case <-ctx.Done():
			return ctx.Err()
		case <-t.C:
		}
	}
	return nil
}

// env is what every scenario gets: its configuration, a logger, its
// progress line, and a list of things to close when it ends (in reverse).
type env struct {
	cfg      *config
	log      *slog.Logger
	progress *progress
	closers  []func()
}

func (e *env) onClose(f func()) { e.closers = append(e.closers, f) }

func (e *env) close() {
	for i := len(e.closers) - 1; i >= 0; i-- {
		e.closers[i]()
	}
	e.closers = nil
}
