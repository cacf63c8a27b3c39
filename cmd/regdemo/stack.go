package main

import (
	"context"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net"
	"net/http"
	"os"
	"strings"
	"sync"
	"time"

	"google.golang.org/grpc"

	"github.com/regcluster/registry/balance"
	"github.com/regcluster/registry/client"
	"github.com/regcluster/registry/internal/embedded"
	"github.com/regcluster/registry/internal/node"
	registryv1 "github.com/regcluster/registry/proto/registry/v1"
)

// The backends and their registry weights: A takes half the calls when
// all are healthy, so its ejection and its ramp show in the shares.
var weights = map[string]uint32{"A": 200, "B": 100, "C": 100}

// ids are the backends in display order; C is the one in its own process.
var ids = []string{"A", "B", "C"}

// Settings are the demo's knobs. The data plane's policy is the SDK's
// default except where a field says otherwise, and the output says so.
type Settings struct {
	// SlowStart is the client's slow-start window (SDK default 30s).
	SlowStart time.Duration
	// BaseEjection is the client's first ejection (SDK default 30s).
	BaseEjection time.Duration
	// TTL is every backend's lease TTL (SDK default 10s): how long a
	// killed C stays registered.
	TTL time.Duration
}

// DefaultSettings keep the scripted story under a minute.
func DefaultSettings() Settings {
	return Settings{SlowStart: 9 * time.Second, BaseEjection: 6 * time.Second, TTL: 5 * time.Second}
}

// policy is the client's: the SDK's defaults, with smooth weighted round
// robin (the seed's round robin, by weight: exact shares, so the table
// reads plainly), Work listed as idempotent (so a call that reached a
// failing or dying instance is retried on another), and s's windows.
func (s Settings) policy() client.Policy {
	p := client.DefaultPolicy()
	p.Picker = balance.PickerWRR
	p.SlowStartWindow = s.SlowStart
	p.BaseEjection = s.BaseEjection
	p.MaxEjection = 10 * s.BaseEjection
	p.Idempotent = []string{"/" + demoGRPCService + "/*"}
	return p
}

// describe says what differs from the SDK's defaults, for the output.
func (s Settings) describe() string {
	d := client.DefaultPolicy()
	return fmt.Sprintf("client policy: smooth weighted round robin (SDK default: p2c), slow start %v (default %v), "+
		"ejection after %d failures in a row for %v (default %v), %d retries, Work idempotent; "+
		"backends: weights A=%d B=%d C=%d, lease TTL %v (default 10s), HTTP check on /health every 1s "+
		"(2 failures to DEGRADED, 2 more to UNAVAILABLE, 1 success back each step)",
		s.SlowStart, d.SlowStartWindow, d.ConsecutiveFailures, s.BaseEjection, d.BaseEjection, d.MaxRetries,
		weights["A"], weights["B"], weights["C"], s.TTL)
}

// Stack is everything the demo runs: a regnode on embedded etcd, the
// backends (A and B in this process, C in a child process), the client
// and its channel to registry:///demo. Close stops all of it and removes
// its temp dir.
type Stack struct {
	settings Settings
	out      io.Writer // synchronized
	dir      string
	node     *node.Node
	client   *client.Client
	sub      *client.Subscription
	cc       *grpc.ClientConn
	http     *http.Client // to the backends' HTTP endpoints

	mu struct {
		sync.Mutex
		local map[string]*Backend // A, B
		regs  map[string]*client.Registration
		child *childBackend // C, nil once killed and reaped
		addrs map[string]string
	}
}

// StartStack brings everything up; on error it has stopped what it had
// started.
func StartStack(ctx context.Context, s Settings, out io.Writer) (_ *Stack, err error) {
	st := &Stack{settings: s, out: out, http: newHTTPClient()}
	st.mu.local, st.mu.regs, st.mu.addrs = map[string]*Backend{}, map[string]*client.Registration{}, map[string]string{}
	defer func() {
		if err != nil {
			st.Close()
		}
	}()
	if st.dir, err = os.MkdirTemp("", "regdemo-*"); err != nil {
		return nil, fmt.Errorf("temp dir: %w", err)
	}
	if err := st.startNode(ctx); err != nil {
		return nil, err
	}
	clog := slog.New(newLineHandler(out, "client ", slog.LevelInfo))
	p := s.policy()
	if st.client, err = client.New(client.Config{Endpoints: []string{st.node.Addr()}, Logger: clog, Policy: &p}); err != nil {
		return nil, err
	}
	if st.sub, err = st.client.Subscribe(ctx, demoService, client.SubscribeOptions{}); err != nil {
		return nil, fmt.Errorf("subscribe to %s: %w", demoService, err)
	}
	opts := append(st.client.DialOptions(), grpc.WithChainUnaryInterceptor(recordAttempts))
	if st.cc, err = grpc.NewClient("registry:///"+demoService, opts...); err != nil {
		return nil, fmt.Errorf("channel to registry:///%s: %w", demoService, err)
	}
	st.cc.Connect()
	for _, id := range []string{"A", "B"} {
		b, err := StartBackend(id)
		if err != nil {
			return nil, err
		}
		st.mu.local[id], st.mu.addrs[id] = b, b.Addr
		rctx, cancel := context.WithTimeout(ctx, 30*time.Second)
		reg, err := registerBackend(rctx, st.client, b, weights[id], s.TTL)
		cancel()
		if err != nil {
			return nil, err
		}
		st.mu.regs[id] = reg
	}
	if err := st.StartC(ctx); err != nil {
		return nil, err
	}
	return st, nil
}

// startNode starts the regnode on embedded etcd in the temp dir. etcd
// needs its ports named in advance: free ones are picked, and picked
// again if another process took one in between.
func (st *Stack) startNode(ctx context.Context) error {
	nlog := slog.New(newLineHandler(st.out, "regnode", slog.LevelWarn))
	for attempt := 1; ; attempt++ {
		cu, pu, err := freeURL(), freeURL(), error(nil)
		if cu == "" || pu == "" {
			return errors.New("no free loopback port for etcd")
		}
		st.node, err = node.Start(ctx, node.Config{
			Listen: "127.0.0.1:0", MetricsListen: "127.0.0.1:0", Logger: nlog, ShutdownGrace: 500 * time.Millisecond,
			Embed: embedded.Config{Name: "regdemo", Dir: fmt.Sprintf("%s/etcd-%d", st.dir, attempt),
				ListenClientURLs: []string{cu}, ListenPeerURLs: []string{pu}, LogLevel: "error",
				// The data is thrown away at exit.
				UnsafeNoFsync: true},
		})
		if err == nil {
			return nil
		}
		st.node = nil
		if !strings.Contains(err.Error(), "address already in use") || attempt == 5 {
			return fmt.Errorf("start regnode: %w", err)
		}
	}
}

func freeURL() string {
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return ""
	}
	defer l.Close()
	return "http://" + l.Addr().String()
}

// StartC starts backend C in its own process (again, after a kill).
func (st *Stack) StartC(ctx context.Context) error {
	st.mu.Lock()
	running := st.mu.child != nil
	st.mu.Unlock()
	if running {
		return nil
	}
	p, err := startChild(ctx, "C", weights["C"], st.node.Addr(), st.settings.TTL, st.out)
	if err != nil {
		return err
	}
	st.mu.Lock()
	st.mu.child, st.mu.addrs["C"] = p, p.Addr
	st.mu.Unlock()
	return nil
}

// KillC is kill -9 of C's process; it returns once the process is reaped.
func (st *Stack) KillC() bool {
	st.mu.Lock()
	p := st.mu.child
	st.mu.child = nil
	st.mu.Unlock()
	if p == nil {
		return false
	}
	p.Kill()
	return true
}

// Addr is the address of backend id.
func (st *Stack) Addr(id string) string {
	st.mu.Lock()
	defer st.mu.Unlock()
	return st.mu.addrs[id]
}

// Toggle flips backend id's fail mode over HTTP, as the seed's curl does.
func (st *Stack) Toggle(ctx context.Context, id string) (bool, error) {
	if id == "C" && !st.CAlive() {
		return false, errors.New("C is not running (kill C; heal starts it again)")
	}
	return toggleFail(ctx, st.http, st.Addr(id))
}

// CPid is the pid of C's process (0 if not running).
func (st *Stack) CPid() int {
	st.mu.Lock()
	defer st.mu.Unlock()
	if st.mu.child == nil {
		return 0
	}
	return st.mu.child.cmd.Process.Pid
}

// CAlive reports whether C's process runs.
func (st *Stack) CAlive() bool {
	st.mu.Lock()
	defer st.mu.Unlock()
	return st.mu.child != nil && !st.mu.child.Exited()
}

// Drain marks id DRAINING in the registry, as an operator's `regctl
// drain` does; Undrain undoes it.
func (st *Stack) Drain(ctx context.Context, id string) error {
	_, err := st.client.API().Drain(ctx, &registryv1.DrainRequest{Service: demoService, Id: id, Reason: "regdemo: drain " + id})
	return client.FromStatus(err)
}

// Undrain marks id SERVING again.
func (st *Stack) Undrain(ctx context.Context, id string) error {
	_, err := st.client.API().Undrain(ctx, &registryv1.UndrainRequest{Service: demoService, Id: id})
	return client.FromStatus(err)
}

// View is the registry's record of each instance, as the client's
// subscription sees it (nil: not registered).
func (st *Stack) View() map[string]*registryv1.Instance {
	v := map[string]*registryv1.Instance{}
	for _, in := range st.sub.Instances(demoService) {
		v[in.GetId()] = in
	}
	return v
}

// Weight is the weight the channel's current picker gives id (0: not
// pickable: ejected, unroutable, draining or not connected).
func (st *Stack) Weight(id string) int64 {
	return st.client.Metrics().Counts().Weights[demoService+"/"+id]
}

// Counts are the client's data-plane counters.
func (st *Stack) Counts() balance.Counts { return st.client.Metrics().Counts() }

// Close stops everything, in order, and removes the temp dir. It may be
// called on a stack half started.
func (st *Stack) Close() {
	if st.cc != nil {
		st.cc.Close()
	}
	if st.sub != nil {
		st.sub.Close()
	}
	st.mu.Lock()
	regs, local, p := st.mu.regs, st.mu.local, st.mu.child
	st.mu.child = nil
	st.mu.Unlock()
	var wg sync.WaitGroup
	for _, reg := range regs {
		wg.Add(1)
		go func() {
			defer wg.Done()
			ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
			defer cancel()
			_ = reg.Close(ctx)
		}()
	}
	if p != nil {
		wg.Add(1)
		go func() { defer wg.Done(); p.Stop() }()
	}
	wg.Wait()
	for _, b := range local {
		b.Close()
	}
	if st.client != nil {
		st.client.Close()
	}
	if st.node != nil {
		st.node.Close()
	}
	if st.dir != "" {
		os.RemoveAll(st.dir)
	}
}
