package main_test

import (
	"context"
	"fmt"
	"io"
	"log/slog"
	"net"
	"net/http"
	"os"
	"os/exec"
	"regexp"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	clientv3 "go.etcd.io/etcd/client/v3"
	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials/insecure"
	healthpb "google.golang.org/grpc/health/grpc_health_v1"
	"google.golang.org/protobuf/types/known/durationpb"

	"github.com/regcluster/registry/client"
	"github.com/regcluster/registry/internal/etcdtest"
	registryv1 "github.com/regcluster/registry/proto/registry/v1"
	"github.com/regcluster/registry/record"
)

// The state that must survive a lost lease, shown on real regnode
// processes, a real etcd and the SDK's keeper, and asserted from etcd's
// history of every key: every revision, not a final read.

// stateNode is one regnode process on an external etcd.
type stateNode struct {
	api, metrics string
	cmd          *exec.Cmd
	stderr       *lockedBuffer
	done         chan struct{}
}

type lockedBuffer struct {
	mu sync.Mutex
	b  strings.Builder
}

func (l *lockedBuffer) Write(p []byte) (int, error) {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.b.Write(p)
}

func (l *lockedBuffer) String() string {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.b.String()
}

// startStateNode runs a regnode on the etcd at etcdURL with a 2s session
// TTL and 100ms probes, and waits until it serves.
func startStateNode(t *testing.T, etcdURL string) *stateNode {
	t.Helper()
	n := &stateNode{api: fmt.Sprintf("127.0.0.1:%d", etcdtest.FreePort(t)),
		metrics: fmt.Sprintf("127.0.0.1:%d", etcdtest.FreePort(t)), stderr: &lockedBuffer{}, done: make(chan struct{})}
	n.cmd = exec.Command(binary)
	n.cmd.Env = append(os.Environ(), "REGNODE_ETCD_ENDPOINTS="+etcdURL, "REGNODE_NAME=state-1", "REGNODE_LISTEN="+n.api,
		"REGNODE_METRICS_LISTEN="+n.metrics, "REGNODE_SESSION_TTL=2s", "REGNODE_PROBE_INTERVAL=100ms", "REGNODE_LOG_LEVEL=warn")
	n.cmd.Stderr = n.stderr
	if err := n.cmd.Start(); err != nil {
		t.Fatal(err)
	}
	go func() { _ = n.cmd.Wait(); close(n.done) }()
	t.Cleanup(func() {
		select {
		case <-n.done:
		default:
			_ = n.cmd.Process.Signal(syscall.SIGCONT)
			_ = n.cmd.Process.Kill()
			<-n.done
		}
	})
	cc, err := grpc.NewClient(n.api, grpc.WithTransportCredentials(insecure.NewCredentials()))
	if err != nil {
		t.Fatal(err)
	}
	defer cc.Close()
	waitCond(t, 60*time.Second, "regnode serving", func() bool {
		ctx, cancel := context.WithTimeout(context.Background(), time.Second)
		defer cancel()
		resp, err := healthpb.NewHealthClient(cc).Check(ctx, &healthpb.HealthCheckRequest{Service: "registry.v1.Registry"})
		return err == nil && resp.Status == healthpb.HealthCheckResponse_SERVING
	}, n)
	return n
}

// probes is the node's registry_probes_total, all results summed.
func (n *stateNode) probes(t *testing.T) int {
	t.Helper()
	resp, err := http.Get("http://" + n.metrics + "/metrics")
	if err != nil {
		t.Fatalf("metrics: %v", err)
	}
	defer resp.Body.Close()
	body, err := io.ReadAll(resp.Body)
	if err != nil {
		t.Fatalf("metrics: %v", err)
	}
	total := 0
	for _, m := range regexp.MustCompile(`(?m)^registry_probes_total\{result="[a-z]+"\} (\d+)`).FindAllStringSubmatch(string(body), -1) {
		v, err := strconv.Atoi(m[1])
		if err != nil {
			t.Fatalf("metrics line %q: %v", m[0], err)
		}
		total += v
	}
	return total
}

// waitCond waits until cond holds; d only bounds a broken test.
func waitCond(t *testing.T, d time.Duration, what string, cond func() bool, n *stateNode) {
	t.Helper()
	deadline := time.Now().Add(d)
	for !cond() {
		if time.Now().After(deadline) {
			if n != nil {
				t.Fatalf("waited %s for %s; regnode stderr:\n%s", d, what, n.stderr)
			}
			t.Fatalf("waited %s for %s", d, what)
		}
		time.Sleep(50 * time.Millisecond)
	}
}

// version is one revision of an instance key.
type version struct {
	rev, create int64
	deleted     bool
	lease       int64
	in          *registryv1.Instance // nil when deleted
}

// history reads every revision of every instance key from etcd (a watch
// from revision 1 up to the current revision), by instance id.
func history(t *testing.T, cli *clientv3.Client) map[string][]version {
	t.Helper()
	keys := record.NewKeys("")
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	head, err := cli.Get(ctx, "\x00") // any key: the header's revision is the head
	if err != nil {
		t.Fatal(err)
	}
	upto := head.Header.Revision
	out := map[string][]version{}
	wch := cli.Watch(ctx, keys.Instances(), clientv3.WithPrefix(), clientv3.WithRev(1), clientv3.WithProgressNotify())
	tick := time.NewTicker(100 * time.Millisecond)
	defer tick.Stop()
	for {
		select {
		case <-tick.C:
			if err := cli.RequestProgress(ctx); err != nil {
				t.Fatal(err)
			}
		case resp, ok := <-wch:
			if !ok {
				t.Fatalf("history watch ended: %v", ctx.Err())
			}
			if err := resp.Err(); err != nil {
				t.Fatalf("history watch: %v", err)
			}
			for _, ev := range resp.Events {
				_, id, ok := keys.Parse(string(ev.Kv.Key))
				if !ok || ev.Kv.ModRevision > upto {
					continue
				}
				v := version{rev: ev.Kv.ModRevision, create: ev.Kv.CreateRevision, lease: ev.Kv.Lease, deleted: ev.Type == clientv3.EventTypeDelete}
				if !v.deleted {
					in, err := keys.Decode(string(ev.Kv.Key), ev.Kv.Value, ev.Kv.CreateRevision, ev.Kv.ModRevision)
					if err != nil {
						t.Fatalf("revision %d of %s: %v", v.rev, ev.Kv.Key, err)
					}
					v.in = in
				}
				out[id] = append(out[id], v)
			}
			if resp.Header.Revision >= upto && (resp.IsProgressNotify() || len(resp.Events) > 0 && resp.Events[len(resp.Events)-1].Kv.ModRevision >= upto) {
				return out
			}
		}
	}
}

// creations counts the versions that created the key (registrations).
func creations(vs []version) int {
	n := 0
	for _, v := range vs {
		if !v.deleted && v.rev == v.create {
			n++
		}
	}
	return n
}

// sdk is a client of the regnode at api, closed when the test ends.
func sdk(t *testing.T, api string) *client.Client {
	t.Helper()
	c, err := client.New(client.Config{Endpoints: []string{api}, Logger: slog.New(slog.NewTextHandler(io.Discard, nil))})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { c.Close() })
	return c
}

func sdkRegister(t *testing.T, c *client.Client, id, addr string, check *registryv1.HealthCheck) *client.Registration {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	reg, err := c.Register(ctx, &registryv1.Instance{Service: "orders", Id: id, Address: addr, Check: check,
		Lifecycle: registryv1.Lifecycle_LIFECYCLE_SERVING}, client.RegisterOptions{TTL: 2 * time.Second, DrainGrace: 100 * time.Millisecond})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
		defer cancel()
		if err := reg.Close(ctx); err != nil {
			t.Errorf("close the registration of %s: %v", id, err)
		}
	})
	return reg
}

func drain(t *testing.T, c *client.Client, id, reason string) int64 {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	resp, err := c.API().Drain(ctx, &registryv1.DrainRequest{Service: "orders", Id: id, Reason: reason})
	if err != nil {
		t.Fatalf("drain %s: %v", id, err)
	}
	return resp.Revision
}

// current reads an instance straight from etcd; nil if it has no record.
func current(t *testing.T, cli *clientv3.Client, id string) (*registryv1.Instance, int64) {
	t.Helper()
	keys := record.NewKeys("")
	key := keys.Instance("orders", id)
	resp, err := cli.Get(context.Background(), key)
	if err != nil {
		t.Fatal(err)
	}
	if len(resp.Kvs) == 0 {
		return nil, 0
	}
	in, err := keys.Decode(key, resp.Kvs[0].Value, resp.Kvs[0].CreateRevision, resp.Kvs[0].ModRevision)
	if err != nil {
		t.Fatal(err)
	}
	return in, resp.Kvs[0].Lease
}

// assertDrainedFrom checks that every version of vs from revision from on
// is DRAINING with reason (or a delete), and that the key was created
// again after from: the re-registration itself came back DRAINING.
func assertDrainedFrom(t *testing.T, id string, vs []version, from int64, reason string) {
	t.Helper()
	recreated := false
	for _, v := range vs {
		if v.rev < from || v.deleted {
			continue
		}
		if v.in.Lifecycle != registryv1.Lifecycle_LIFECYCLE_DRAINING || v.in.LifecycleReason != reason {
			t.Fatalf("%s at revision %d (created %d, lease %x): %v %q, want DRAINING %q", id, v.rev, v.create, v.lease, v.in.Lifecycle, v.in.LifecycleReason, reason)
		}
		if v.rev == v.create {
			recreated = true
		}
	}
	if !recreated {
		t.Fatalf("%s was never registered again after revision %d", id, from)
	}
}

// Drain through the API, then revoke the lease in etcd behind the keeper's
// back: the SDK keeper registers the instance again, and the new record is
// DRAINING with the operator's reason from the revision it is created at.
func TestDrainSurvivesRevokedLease(t *testing.T) {
	m := etcdtest.Start(t, false)
	cli := m.Client(t)
	n := startStateNode(t, m.ClientURL)
	c := sdk(t, n.api)
	reg := sdkRegister(t, c, "d-1", "127.0.0.1:9", nil)
	drainedAt := drain(t, c, "d-1", "operator: rack 7 maintenance")

	in, lease := current(t, cli, "d-1")
	if in == nil || in.Lifecycle != registryv1.Lifecycle_LIFECYCLE_DRAINING {
		t.Fatalf("after the drain: %v", in)
	}
	if _, err := cli.Revoke(context.Background(), clientv3.LeaseID(lease)); err != nil {
		t.Fatal(err)
	}
	waitCond(t, 30*time.Second, "d-1 registered again under a new lease", func() bool {
		in, l := current(t, cli, "d-1")
		return in != nil && l != lease
	}, n)
	// The key lands in etcd before the keeper's answer is counted.
	waitCond(t, 30*time.Second, "the keeper to count its second registration", func() bool {
		return reg.Status().Registrations >= 2
	}, n)
	h := history(t, cli)["d-1"]
	assertDrainedFrom(t, "d-1", h, drainedAt, "operator: rack 7 maintenance")
	if creations(h) < 2 {
		t.Fatalf("d-1 created %d times: %+v", creations(h), h)
	}
}

// SIGSTOP the only regnode (the keepers' and the prober's) until etcd has
// expired every lease (the instances' and the prober's session), then
// SIGCONT it: the keepers register again through it, and etcd's history
// shows that the drained instance was DRAINING at every revision since the
// drain, the instance that never answered was routable at no revision and
// UNAVAILABLE at every one since it first was, and the healthy one came
// back HEALTHY (its last health, not UNKNOWN).
func TestPausedRegnodeKeepsState(t *testing.T) {
	m := etcdtest.Start(t, false)
	cli := m.Client(t)
	n := startStateNode(t, m.ClientURL)
	c := sdk(t, n.api)

	lis, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	go func() {
		for {
			conn, err := lis.Accept()
			if err != nil {
				return
			}
			conn.Close()
		}
	}()
	t.Cleanup(func() { lis.Close() })
	dead, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	deadAddr := dead.Addr().String()
	dead.Close()
	tcp := &registryv1.HealthCheck{Kind: registryv1.CheckKind_CHECK_KIND_TCP,
		Timeout: durationpb.New(2 * time.Second), SlowThreshold: durationpb.New(time.Second)}

	sdkRegister(t, c, "drained", lis.Addr().String(), tcp)
	sdkRegister(t, c, "dead", deadAddr, tcp)
	sdkRegister(t, c, "live", lis.Addr().String(), tcp)
	drainedAt := drain(t, c, "drained", "operator: kernel upgrade")
	state := func(id string) registryv1.HealthState {
		in, _ := current(t, cli, id)
		return in.GetHealth().GetState()
	}
	waitCond(t, 30*time.Second, "dead UNAVAILABLE, live HEALTHY", func() bool {
		return state("dead") == registryv1.HealthState_HEALTH_STATE_UNAVAILABLE && state("live") == registryv1.HealthState_HEALTH_STATE_HEALTHY
	}, n)

	if err := n.cmd.Process.Signal(syscall.SIGSTOP); err != nil {
		t.Fatal(err)
	}
	paused := true
	defer func() {
		if paused {
			_ = n.cmd.Process.Signal(syscall.SIGCONT)
		}
	}()
	keys := record.NewKeys("")
	count := func(prefix string) int64 {
		resp, err := cli.Get(context.Background(), prefix, clientv3.WithPrefix(), clientv3.WithCountOnly())
		if err != nil {
			t.Fatal(err)
		}
		return resp.Count
	}
	waitCond(t, 60*time.Second, "every lease expired while regnode is stopped", func() bool {
		return count(keys.Instances()) == 0 && count(keys.Election()) == 0
	}, nil)
	if err := n.cmd.Process.Signal(syscall.SIGCONT); err != nil {
		t.Fatal(err)
	}
	paused = false
	waitCond(t, 60*time.Second, "every instance registered again", func() bool {
		return count(keys.Instances()) == 3
	}, n)
	// The prober leads again and has probed every instance several times
	// since, so any wrong health write would be in the history.
	before := n.probes(t)
	waitCond(t, 60*time.Second, "the prober probing again", func() bool {
		return count(keys.Election()) > 0 && n.probes(t) >= before+30
	}, n)

	h := history(t, cli)
	for _, id := range []string{"drained", "dead", "live"} {
		if got := creations(h[id]); got < 2 {
			t.Fatalf("%s created %d times: the lease loss did not happen", id, got)
		}
	}
	assertDrainedFrom(t, "drained", h["drained"], drainedAt, "operator: kernel upgrade")

	sawUnavailable := false
	for _, v := range h["dead"] {
		if v.deleted {
			continue
		}
		if record.Routable(v.in) {
			t.Fatalf("dead routable at revision %d: %v", v.rev, v.in)
		}
		st := v.in.GetHealth().GetState()
		if sawUnavailable && st != registryv1.HealthState_HEALTH_STATE_UNAVAILABLE {
			t.Fatalf("dead at revision %d (created %d): %v after being UNAVAILABLE", v.rev, v.create, st)
		}
		sawUnavailable = sawUnavailable || st == registryv1.HealthState_HEALTH_STATE_UNAVAILABLE
	}
	for _, v := range h["live"] {
		if !v.deleted && v.rev == v.create && v.create > drainedAt && v.in.GetHealth().GetState() != registryv1.HealthState_HEALTH_STATE_HEALTHY {
			t.Fatalf("live registered again at revision %d as %v, want its last health HEALTHY", v.rev, v.in.GetHealth().GetState())
		}
	}
}
