package integration

import (
	"bytes"
	"context"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	clientv3 "go.etcd.io/etcd/client/v3"
	"go.uber.org/zap"
	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials/insecure"
	healthpb "google.golang.org/grpc/health/grpc_health_v1"

	"github.com/regcluster/registry/internal/etcdtest"
)

// BuildRegnode builds the regnode binary into dir (once per test run) and
// returns its path.
func BuildRegnode(dir string, tags ...string) (string, error) {
	bin := filepath.Join(dir, "regnode")
	args := []string{"build", "-o", bin}
	if len(tags) > 0 {
		args = append(args, "-tags", strings.Join(tags, ","))
	}
	args = append(args, "github.com/regcluster/registry/cmd/regnode")
	if out, err := exec.Command("go", args...).CombinedOutput(); err != nil {
		return "", fmt.Errorf("build regnode: %v\n%s", err, out)
	}
	return bin, nil
}

func freePort(t testing.TB) int { return etcdtest.FreePort(t) }

// Node is one regnode process and the etcd member it embeds.
type Node struct {
	Name      string
	API       string // host:port of the registry API
	Metrics   string
	ClientURL string // the embedded member's client URL
	PeerURL   string
	dir       string
	env       []string

	mu     sync.Mutex
	cmd    *exec.Cmd
	stderr *bytes.Buffer
	done   chan struct{}
}

// Cluster is three regnodes embedding the three members of one etcd
// cluster, as real processes on loopback.
type Cluster struct {
	t     testing.TB
	bin   string
	Nodes []*Node
	// Etcd is a client of all three members, for the test's own reads.
	Etcd *clientv3.Client
}

// StartCluster starts n regnodes embedding the n members of one etcd
// cluster, with a 2s prober session TTL and 100ms probes, and waits until
// every one serves. Everything stops when the test ends.
//
// Ports are picked free (etcdtest.FreePort) and bound later by the
// regnode; another test process may take one in between. A regnode that
// exits because its address is in use makes the cluster start again with
// new ports (at most three attempts).
func StartCluster(t testing.TB, bin string, n int, env ...string) *Cluster {
	t.Helper()
	for attempt := 1; ; attempt++ {
		c, busy := startCluster(t, bin, n, env...)
		if busy == nil {
			return c
		}
		if attempt == 3 {
			t.Fatalf("%s: an address was in use at each of %d attempts:\n%s", busy.Name, attempt, lastLines(busy.Stderr(), 20))
		}
		t.Logf("%s: a port picked for it was taken before it bound it; starting the cluster again with new ports", busy.Name)
	}
}

// startCluster is one attempt of StartCluster; busy is the node that
// exited because an address it was given was in use (the cluster is
// then stopped).
func startCluster(t testing.TB, bin string, n int, env ...string) (c *Cluster, busy *Node) {
	t.Helper()
	c = &Cluster{t: t, bin: bin}
	var initial []string
	for i := range n {
		nd := &Node{Name: fmt.Sprintf("n%d", i+1), dir: t.TempDir(),
			API:       fmt.Sprintf("127.0.0.1:%d", freePort(t)),
			Metrics:   fmt.Sprintf("127.0.0.1:%d", freePort(t)),
			ClientURL: fmt.Sprintf("http://127.0.0.1:%d", freePort(t)),
			PeerURL:   fmt.Sprintf("http://127.0.0.1:%d", freePort(t))}
		initial = append(initial, nd.Name+"="+nd.PeerURL)
		c.Nodes = append(c.Nodes, nd)
	}
	for _, nd := range c.Nodes {
		nd.env = append(os.Environ(),
			"REGNODE_NAME="+nd.Name, "REGNODE_LISTEN="+nd.API, "REGNODE_METRICS_LISTEN="+nd.Metrics,
			"REGNODE_DATA_DIR="+filepath.Join(nd.dir, "data"),
			"REGNODE_LISTEN_CLIENT_URLS="+nd.ClientURL, "REGNODE_LISTEN_PEER_URLS="+nd.PeerURL,
			"REGNODE_INITIAL_CLUSTER="+strings.Join(initial, ","),
			"REGNODE_SESSION_TTL=2s", "REGNODE_PROBE_INTERVAL=100ms", "REGNODE_LOG_LEVEL=warn",
			"REGNODE_SHUTDOWN_GRACE=500ms")
		nd.env = append(nd.env, env...)
		c.start(nd)
	}
	t.Cleanup(c.stopAll)
	for _, nd := range c.Nodes {
		if c.waitServing(nd) {
			c.stopAll()
			return nil, nd
		}
	}
	var eps []string
	for _, nd := range c.Nodes {
		eps = append(eps, nd.ClientURL)
	}
	cli, err := clientv3.New(clientv3.Config{Endpoints: eps, DialTimeout: 2 * time.Second, Logger: zap.NewNop()})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { cli.Close() })
	c.Etcd = cli
	return c, nil
}

func (c *Cluster) start(nd *Node) {
	nd.mu.Lock()
	defer nd.mu.Unlock()
	cmd := exec.Command(c.bin)
	cmd.Env = nd.env
	nd.stderr = &bytes.Buffer{}
	cmd.Stderr = &lockedWriter{mu: &nd.mu, w: nd.stderr}
	if err := cmd.Start(); err != nil {
		c.t.Fatalf("start %s: %v", nd.Name, err)
	}
	nd.cmd, nd.done = cmd, make(chan struct{})
	done := nd.done
	go func() { cmd.Wait(); close(done) }()
}

type lockedWriter struct {
	mu *sync.Mutex
	w  *bytes.Buffer
}

func (l *lockedWriter) Write(p []byte) (int, error) {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.w.Write(p)
}

// Stderr is what the node's current process wrote so far.
func (nd *Node) Stderr() string {
	nd.mu.Lock()
	defer nd.mu.Unlock()
	return nd.stderr.String()
}

func (c *Cluster) stopAll() {
	for _, nd := range c.Nodes {
		nd.mu.Lock()
		cmd, done := nd.cmd, nd.done
		nd.mu.Unlock()
		if cmd != nil {
			cmd.Process.Signal(syscall.SIGCONT)
			cmd.Process.Kill()
			<-done
		}
	}
	if c.t.Failed() {
		// What the regnodes said is often what explains a violation.
		for _, nd := range c.Nodes {
			c.t.Logf("%s's last words:\n%s", nd.Name, lastLines(nd.Stderr(), 60))
		}
	}
}

// lastLines is s's last n lines.
func lastLines(s string, n int) string {
	lines := strings.Split(strings.TrimRight(s, "\n"), "\n")
	if len(lines) > n {
		lines = lines[len(lines)-n:]
	}
	return strings.Join(lines, "\n")
}

// WaitServing waits until nd's API answers health checks as SERVING.
func (c *Cluster) WaitServing(nd *Node) {
	c.t.Helper()
	if c.waitServing(nd) {
		c.t.Fatalf("%s exited: an address it was given is in use:\n%s", nd.Name, lastLines(nd.Stderr(), 20))
	}
}

// waitServing is WaitServing, but reports (true) a node that exited
// because an address it was given was in use, instead of failing.
func (c *Cluster) waitServing(nd *Node) (addressInUse bool) {
	c.t.Helper()
	cc, err := grpc.NewClient(nd.API, grpc.WithTransportCredentials(insecure.NewCredentials()))
	if err != nil {
		c.t.Fatal(err)
	}
	defer cc.Close()
	deadline := time.Now().Add(60 * time.Second)
	for {
		ctx, cancel := context.WithTimeout(context.Background(), time.Second)
		resp, err := healthpb.NewHealthClient(cc).Check(ctx, &healthpb.HealthCheckRequest{Service: "registry.v1.Registry"})
		cancel()
		if err == nil && resp.Status == healthpb.HealthCheckResponse_SERVING {
			return false
		}
		nd.mu.Lock()
		done := nd.done
		nd.mu.Unlock()
		select {
		case <-done:
			if strings.Contains(nd.Stderr(), "address already in use") {
				return true
			}
			c.t.Fatalf("%s exited before serving:\n%s", nd.Name, lastLines(nd.Stderr(), 40))
		default:
		}
		if time.Now().After(deadline) {
			c.t.Fatalf("%s not serving after 60s: %v\n%s", nd.Name, err, nd.Stderr())
		}
		time.Sleep(100 * time.Millisecond)
	}
}

// Kill stops nd at once (SIGKILL): its member and API vanish mid-flight.
func (c *Cluster) Kill(nd *Node) { c.signal(nd, syscall.SIGKILL, true) }

// Stop stops nd gracefully (SIGTERM) and checks it exits 0.
func (c *Cluster) Stop(nd *Node) {
	c.t.Helper()
	c.signal(nd, syscall.SIGTERM, true)
	if code := nd.cmd.ProcessState.ExitCode(); code != 0 {
		c.t.Fatalf("%s exited %d after SIGTERM:\n%s", nd.Name, code, nd.Stderr())
	}
}

// Pause freezes nd (SIGSTOP); Resume thaws it.
func (c *Cluster) Pause(nd *Node)  { c.signal(nd, syscall.SIGSTOP, false) }
func (c *Cluster) Resume(nd *Node) { c.signal(nd, syscall.SIGCONT, false) }

func (c *Cluster) signal(nd *Node, sig syscall.Signal, wait bool) {
	c.t.Helper()
	nd.mu.Lock()
	cmd, done := nd.cmd, nd.done
	nd.mu.Unlock()
	if err := cmd.Process.Signal(sig); err != nil {
		c.t.Fatalf("signal %s: %v", nd.Name, err)
	}
	if wait {
		select {
		case <-done:
		case <-time.After(30 * time.Second):
			c.t.Fatalf("%s did not exit after %v", nd.Name, sig)
		}
	}
}

// Restart starts nd again on its data and waits until it serves.
func (c *Cluster) Restart(nd *Node) {
	c.t.Helper()
	c.start(nd)
	c.WaitServing(nd)
}

// APIs returns the API addresses of all nodes.
func (c *Cluster) APIs() []string {
	var out []string
	for _, nd := range c.Nodes {
		out = append(out, nd.API)
	}
	return out
}

// EtcdLeader returns the node whose member leads etcd.
func (c *Cluster) EtcdLeader() *Node {
	c.t.Helper()
	for _, nd := range c.Nodes {
		ctx, cancel := context.WithTimeout(context.Background(), time.Second)
		st, err := c.Etcd.Status(ctx, nd.ClientURL)
		cancel()
		if err == nil && st.Leader == st.Header.MemberId {
			return nd
		}
	}
	c.t.Fatal("no etcd leader")
	return nil
}

// Node returns the node named name.
func (c *Cluster) Node(name string) *Node {
	for _, nd := range c.Nodes {
		if nd.Name == name {
			return nd
		}
	}
	return nil
}

// Compact compacts etcd at its current revision, once the history recorder
// h has seen it (so the checker keeps a complete history).
func (c *Cluster) Compact(h *History) int64 {
	c.t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	resp, err := c.Etcd.Get(ctx, "compact-probe")
	if err != nil {
		c.t.Fatal(err)
	}
	rev := resp.Header.Revision
	h.WaitFor(c.t, rev)
	if _, err := c.Etcd.Compact(ctx, rev); err != nil {
		c.t.Fatal(err)
	}
	return rev
}

// PutJunk writes a value under the instances prefix that is not a valid
// record. It may fail during a fault (etcd without a leader); it is called
// from the workload's goroutine, so it reports rather than fails the test.
func (c *Cluster) PutJunk(key, value string) error {
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	if _, err := c.Etcd.Put(ctx, key, value); err != nil {
		return fmt.Errorf("put junk %s: %w", key, err)
	}
	return nil
}
