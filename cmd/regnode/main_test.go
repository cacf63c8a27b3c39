package main_test

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/credentials/insecure"
	healthpb "google.golang.org/grpc/health/grpc_health_v1"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/types/known/durationpb"

	"github.com/regcluster/registry/internal/etcdtest"
	registryv1 "github.com/regcluster/registry/proto/registry/v1"
)

var binary string

func TestMain(m *testing.M) {
	dir, err := os.MkdirTemp("", "regnode-bin")
	if err != nil {
		panic(err)
	}
	binary = filepath.Join(dir, "regnode")
	if out, err := exec.Command("go", "build", "-race", "-o", binary, ".").CombinedOutput(); err != nil {
		fmt.Fprintf(os.Stderr, "build regnode: %v\n%s", err, out)
		os.Exit(1)
	}
	code := m.Run()
	os.RemoveAll(dir)
	os.Exit(code)
}

type proc struct {
	cmd    *exec.Cmd
	stderr *syncBuffer
	done   chan struct{} // closed once the process has exited and been reaped
}

// syncBuffer is written by the process's stderr copier while the test reads.
type syncBuffer struct {
	mu sync.Mutex
	b  bytes.Buffer
}

func (s *syncBuffer) Write(p []byte) (int, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.b.Write(p)
}

func (s *syncBuffer) String() string {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.b.String()
}

// start runs regnode configured only through REGNODE_* variables.
func start(t *testing.T, env map[string]string, args ...string) *proc {
	t.Helper()
	cmd := exec.Command(binary, args...)
	cmd.Env = os.Environ()
	for k, v := range env {
		cmd.Env = append(cmd.Env, k+"="+v)
	}
	p := &proc{cmd: cmd, stderr: &syncBuffer{}, done: make(chan struct{})}
	cmd.Stderr = p.stderr
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	go func() { cmd.Wait(); close(p.done) }()
	t.Cleanup(func() {
		select {
		case <-p.done: // exited; ProcessState is safe to read from here on
		default:
			cmd.Process.Signal(syscall.SIGCONT)
			cmd.Process.Kill()
			<-p.done
		}
	})
	return p
}

func (p *proc) wait(t *testing.T, d time.Duration) int {
	t.Helper()
	select {
	case <-p.done:
		return p.cmd.ProcessState.ExitCode()
	case <-time.After(d):
		t.Fatalf("regnode did not exit within %s; stderr:\n%s", d, p.stderr)
		return -1
	}
}

func dial(t *testing.T, addr string) *grpc.ClientConn {
	cc, err := grpc.NewClient(addr, grpc.WithTransportCredentials(insecure.NewCredentials()))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { cc.Close() })
	return cc
}

func waitServing(t *testing.T, cc *grpc.ClientConn, p *proc) {
	t.Helper()
	deadline := time.Now().Add(60 * time.Second)
	for {
		ctx, cancel := context.WithTimeout(context.Background(), time.Second)
		resp, err := healthpb.NewHealthClient(cc).Check(ctx, &healthpb.HealthCheckRequest{Service: "registry.v1.Registry"})
		cancel()
		if err == nil && resp.Status == healthpb.HealthCheckResponse_SERVING {
			return
		}
		if time.Now().After(deadline) {
			t.Fatalf("regnode not serving after 60s: %v; stderr:\n%s", err, p.stderr)
		}
		time.Sleep(100 * time.Millisecond)
	}
}

// regnode configured from the environment serves the API, health and
// metrics; SIGTERM stops it with exit 0; restarted on the same data it
// still holds what was registered.
func TestSignalStopsCleanlyAndKeepsData(t *testing.T) {
	api := fmt.Sprintf("127.0.0.1:%d", etcdtest.FreePort(t))
	metrics := fmt.Sprintf("127.0.0.1:%d", etcdtest.FreePort(t))
	env := map[string]string{
		"REGNODE_LISTEN":             api,
		"REGNODE_METRICS_LISTEN":     metrics,
		"REGNODE_DATA_DIR":           t.TempDir(),
		"REGNODE_NAME":               "n1",
		"REGNODE_LISTEN_CLIENT_URLS": fmt.Sprintf("http://127.0.0.1:%d", etcdtest.FreePort(t)),
		"REGNODE_LISTEN_PEER_URLS":   fmt.Sprintf("http://127.0.0.1:%d", etcdtest.FreePort(t)),
	}
	p := start(t, env)
	cc := dial(t, api)
	waitServing(t, cc, p)
	reg := registryv1.NewRegistryClient(cc)
	ctx := context.Background()
	r, err := reg.Register(ctx, &registryv1.RegisterRequest{
		Instance: &registryv1.Instance{Service: "orders", Id: "o-1", Address: "10.0.0.1:80"},
		Ttl:      durationpb.New(60 * time.Second)})
	if err != nil {
		t.Fatal(err)
	}
	resp, err := http.Get("http://" + metrics + "/metrics")
	if err != nil {
		t.Fatal(err)
	}
	body, _ := io.ReadAll(resp.Body)
	resp.Body.Close()
	if !strings.Contains(string(body), "registry_registrations_total 1") {
		t.Fatalf("/metrics lacks registry_registrations_total 1:\n%.2000s", body)
	}
	if !strings.Contains(p.stderr.String(), "registry API on "+api) {
		t.Fatalf("start-up line missing; stderr:\n%s", p.stderr)
	}
	if err := p.cmd.Process.Signal(syscall.SIGTERM); err != nil {
		t.Fatal(err)
	}
	if code := p.wait(t, 20*time.Second); code != 0 {
		t.Fatalf("exit %d after SIGTERM; stderr:\n%s", code, p.stderr)
	}

	p2 := start(t, env)
	waitServing(t, cc, p2)
	g, err := reg.Get(ctx, &registryv1.GetRequest{Service: "orders", Id: "o-1"})
	if err != nil {
		t.Fatalf("after restart: %v; stderr:\n%s", err, p2.stderr)
	}
	if g.Instance.LeaseId != r.LeaseId || g.Revision < r.Revision {
		t.Fatalf("after restart: %v at %d, registered under %x at %d", g.Instance, g.Revision, r.LeaseId, r.Revision)
	}
	if err := p2.cmd.Process.Signal(syscall.SIGINT); err != nil {
		t.Fatal(err)
	}
	if code := p2.wait(t, 20*time.Second); code != 0 {
		t.Fatalf("exit %d after SIGINT; stderr:\n%s", code, p2.stderr)
	}
}

func TestBadConfigurationExits2(t *testing.T) {
	for _, tc := range []struct {
		name string
		env  map[string]string
		args []string
		want string
	}{
		{"unknown flag", nil, []string{"--no-such-flag"}, "unknown flag"},
		{"bad listen", nil, []string{"--listen", "nonsense"}, "--listen"},
		{"bad log level", nil, []string{"--log-level", "loud"}, "--log-level"},
		{"bad env duration", map[string]string{"REGNODE_SESSION_TTL": "soon"}, nil, "REGNODE_SESSION_TTL"},
		{"bad cluster state", map[string]string{"REGNODE_INITIAL_CLUSTER_STATE": "old"}, nil, "--initial-cluster-state"},
		{"argument", nil, []string{"extra"}, "unknown command"},
		{"zero write burst", nil, []string{"--write-burst", "0"}, "--write-burst"},
		{"bad env stream cap", map[string]string{"REGNODE_MAX_STREAMS_PER_PEER": "0"}, nil, "--max-streams-per-peer"},
		{"bad operator policy", nil, []string{"--operator-deregister", "anyone"}, "--operator-deregister"},
		{"zero registrations cap", nil, []string{"--max-registrations-per-peer", "0"}, "--max-registrations-per-peer"},
		{"zero writes in flight", map[string]string{"REGNODE_MAX_WRITES_IN_FLIGHT_PER_PEER": "0"}, nil, "--max-writes-in-flight-per-peer"},
		{"tiny request cap", map[string]string{"REGNODE_MAX_REQUEST_BYTES": "1024"}, nil, "--max-request-bytes"},
		{"tiny response cap", nil, []string{"--max-response-bytes", "1024"}, "--max-response-bytes"},
		{"negative stream cap", nil, []string{"--max-concurrent-streams", "-1"}, "--max-concurrent-streams"},
		{"negative ring", nil, []string{"--watch-ring-size", "-1"}, "--watch-ring-size: node: Config.RingSize must be >= 0"},
		{"session ttl too long", nil, []string{"--session-ttl", "90s"}, "--session-ttl: node: Config.SessionTTL must be whole seconds within 2s..1m (0: the default), got 1m30s"},
		{"relative prefix", map[string]string{"REGNODE_PREFIX": "registry/"}, nil, `--prefix: node: Config.Prefix must start with '/', got "registry/"`},
		{"zero slow threshold", nil, []string{"--slow-threshold", "0s"}, "--slow-threshold: node: Config.Thresholds.Slow must be > 0, got 0s"},
		{"advertise address without a port", nil, []string{"--advertise-address", "regnode-0"}, `--advertise-address: node: Config.AdvertiseAddress must be host:port that other regnodes can dial`},
		{"unspecified advertise address", map[string]string{"REGNODE_ADVERTISE_ADDRESS": "0.0.0.0:7400"}, nil, `--advertise-address: node: Config.AdvertiseAddress must be host:port that other regnodes can dial: a DNS name or an IP address that is not unspecified, and a port of 1..65535, got "0.0.0.0:7400"`},
		{"advertise port 0", nil, []string{"--advertise-address", "127.0.0.1:0"}, `got "127.0.0.1:0"`},
		{"advertise host not a name", nil, []string{"--advertise-address", "bad_host:7400"}, `got "bad_host:7400"`},
		{"dns listen not host:port", nil, []string{"--dns-listen", "8600"}, `--dns-listen: node: Config.DNS.Listen must be host:port, got "8600"`},
		{"dns listen off loopback", nil, []string{"--dns-listen", "0.0.0.0:8600"}, "--dns-listen 0.0.0.0:8600 is not a loopback address"},
		{"zero dns ttl", nil, []string{"--dns-listen", "127.0.0.1:0", "--dns-ttl", "0s"}, "--dns-ttl: node: Config.DNS.TTL must be whole seconds within 1s..1h0m0s, got 0s"},
		{"bad env dns ttl without dns", map[string]string{"REGNODE_DNS_TTL": "500ms"}, nil, "--dns-ttl: node: Config.DNS.TTL must be whole seconds"},
		{"zero dns rate", map[string]string{"REGNODE_DNS_RATE": "0"}, []string{"--dns-listen", "127.0.0.1:0"}, "--dns-rate: node: Config.DNS.Rate must be > 0"},
		{"bad dns domain", nil, []string{"--dns-domain", "a..b"}, `--dns-domain: node: Config.DNS.Domain must be a domain name`},
	} {
		t.Run(tc.name, func(t *testing.T) {
			p := start(t, tc.env, tc.args...)
			if code := p.wait(t, 20*time.Second); code != 2 {
				t.Fatalf("exit %d, want 2; stderr:\n%s", code, p.stderr)
			}
			if !strings.Contains(p.stderr.String(), tc.want) || strings.Contains(p.stderr.String(), "goroutine ") {
				t.Fatalf("stderr does not say %q clearly:\n%s", tc.want, p.stderr)
			}
		})
	}
}

// An external etcd that is not there is a clear failure, exit 1.
func TestUnreachableEtcdFails(t *testing.T) {
	p := start(t, map[string]string{"REGNODE_ETCD_ENDPOINTS": fmt.Sprintf("http://127.0.0.1:%d", etcdtest.FreePort(t)),
		"REGNODE_LISTEN": "127.0.0.1:0", "REGNODE_METRICS_LISTEN": "off"})
	if code := p.wait(t, 30*time.Second); code != 1 {
		t.Fatalf("exit %d, want 1; stderr:\n%s", code, p.stderr)
	}
	if !strings.Contains(p.stderr.String(), "does not answer") {
		t.Fatalf("stderr:\n%s", p.stderr)
	}
}

// embeddedEnv configures a regnode that embeds one etcd member with its data
// in dir, every port its own.
func embeddedEnv(t *testing.T, dir string) map[string]string {
	return map[string]string{
		"REGNODE_LISTEN":             fmt.Sprintf("127.0.0.1:%d", etcdtest.FreePort(t)),
		"REGNODE_METRICS_LISTEN":     fmt.Sprintf("127.0.0.1:%d", etcdtest.FreePort(t)),
		"REGNODE_DATA_DIR":           dir,
		"REGNODE_NAME":               "n1",
		"REGNODE_LISTEN_CLIENT_URLS": fmt.Sprintf("http://127.0.0.1:%d", etcdtest.FreePort(t)),
		"REGNODE_LISTEN_PEER_URLS":   fmt.Sprintf("http://127.0.0.1:%d", etcdtest.FreePort(t)),
	}
}

// waitStderr waits until the process has written want to stderr (or has
// exited without it).
func (p *proc) waitStderr(t *testing.T, want string) {
	t.Helper()
	deadline := time.Now().Add(60 * time.Second)
	for !strings.Contains(p.stderr.String(), want) {
		select {
		case <-p.done:
			t.Fatalf("regnode exited (%d) without saying %q; stderr:\n%s", p.cmd.ProcessState.ExitCode(), want, p.stderr)
		default:
		}
		if time.Now().After(deadline) {
			t.Fatalf("regnode did not say %q in 60s; stderr:\n%s", want, p.stderr)
		}
		time.Sleep(50 * time.Millisecond)
	}
}

// A second regnode on a data dir another one is using exits non-zero at
// once, naming the directory, instead of waiting forever in bbolt's flock;
// the first one goes on serving. Whoever else holds etcd's backend file (an
// etcdutl, an older regnode) is refused the same way.
func TestDataDirInUseFailsLoudly(t *testing.T) {
	dir := filepath.Join(t.TempDir(), "data")
	first := embeddedEnv(t, dir)
	p1 := start(t, first)
	cc := dial(t, first["REGNODE_LISTEN"])
	waitServing(t, cc, p1)

	p2 := start(t, embeddedEnv(t, dir))
	if code := p2.wait(t, 30*time.Second); code != 1 {
		t.Fatalf("second regnode on %s: exit %d, want 1; stderr:\n%s", dir, code, p2.stderr)
	}
	if msg := p2.stderr.String(); !strings.Contains(msg, "data directory is in use: "+dir) || !strings.Contains(msg, "regnode.lock is locked") {
		t.Fatalf("second regnode's stderr does not name %s as in use by a regnode:\n%s", dir, msg)
	}
	waitServing(t, cc, p1)
	if err := p1.cmd.Process.Signal(syscall.SIGTERM); err != nil {
		t.Fatal(err)
	}
	if code := p1.wait(t, 20*time.Second); code != 0 {
		t.Fatalf("first regnode: exit %d after SIGTERM; stderr:\n%s", code, p1.stderr)
	}

	// Another process holds the backend as bbolt does (flock on
	// member/snap/db), not our lock file.
	db, err := os.Open(filepath.Join(dir, "member", "snap", "db"))
	if err != nil {
		t.Fatal(err)
	}
	defer db.Close()
	if err := syscall.Flock(int(db.Fd()), syscall.LOCK_EX|syscall.LOCK_NB); err != nil {
		t.Fatal(err)
	}
	p3 := start(t, embeddedEnv(t, dir))
	if code := p3.wait(t, 30*time.Second); code != 1 {
		t.Fatalf("regnode on a held backend: exit %d, want 1; stderr:\n%s", code, p3.stderr)
	}
	if msg := p3.stderr.String(); !strings.Contains(msg, "data directory is in use: "+dir) || !strings.Contains(msg, "member/snap/db") {
		t.Fatalf("stderr does not name %s and its held backend:\n%s", dir, msg)
	}
}

// SIGTERM stops a regnode that is still starting, with exit 0, whatever
// it is waiting for: its embedded member to join a cluster whose other
// member never comes, or an external etcd that does not answer.
func TestSignalDuringStartupStopsCleanly(t *testing.T) {
	t.Run("embedded member waiting for its cluster", func(t *testing.T) {
		env := embeddedEnv(t, filepath.Join(t.TempDir(), "data"))
		env["REGNODE_INITIAL_CLUSTER"] = fmt.Sprintf("n1=%s,n2=http://127.0.0.1:%d", env["REGNODE_LISTEN_PEER_URLS"], etcdtest.FreePort(t))
		p := start(t, env)
		p.waitStderr(t, "waiting for the embedded etcd member to join its cluster")
		if err := p.cmd.Process.Signal(syscall.SIGTERM); err != nil {
			t.Fatal(err)
		}
		if code := p.wait(t, 30*time.Second); code != 0 {
			t.Fatalf("exit %d after SIGTERM during start-up; stderr:\n%s", code, p.stderr)
		}
		if !strings.Contains(p.stderr.String(), "signal received during start-up") {
			t.Fatalf("stderr does not say why it stopped:\n%s", p.stderr)
		}
	})
	t.Run("external etcd not answering", func(t *testing.T) {
		p := start(t, map[string]string{"REGNODE_ETCD_ENDPOINTS": fmt.Sprintf("http://127.0.0.1:%d", etcdtest.FreePort(t)),
			"REGNODE_LISTEN": "127.0.0.1:0", "REGNODE_METRICS_LISTEN": "off"})
		p.waitStderr(t, "waiting for etcd to answer")
		if err := p.cmd.Process.Signal(syscall.SIGTERM); err != nil {
			t.Fatal(err)
		}
		if code := p.wait(t, 30*time.Second); code != 0 {
			t.Fatalf("exit %d after SIGTERM during start-up; stderr:\n%s", code, p.stderr)
		}
	})
}

// A port already in use fails start-up before anything is written: a data
// dir that did not exist still does not, and one that did (empty) is
// neither removed nor filled.
func TestPortInUseLeavesNoDataDir(t *testing.T) {
	busy, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer busy.Close()
	for _, port := range []string{"REGNODE_LISTEN", "REGNODE_METRICS_LISTEN", "REGNODE_LISTEN_CLIENT_URLS"} {
		for _, existing := range []bool{false, true} {
			t.Run(fmt.Sprintf("%s existing=%v", port, existing), func(t *testing.T) {
				dir := filepath.Join(t.TempDir(), "data")
				if existing {
					if err := os.Mkdir(dir, 0o700); err != nil {
						t.Fatal(err)
					}
				}
				env := embeddedEnv(t, dir)
				env[port] = busy.Addr().String()
				if port == "REGNODE_LISTEN_CLIENT_URLS" {
					env[port] = "http://" + busy.Addr().String()
				}
				p := start(t, env)
				if code := p.wait(t, 30*time.Second); code != 1 {
					t.Fatalf("exit %d, want 1; stderr:\n%s", code, p.stderr)
				}
				if !strings.Contains(p.stderr.String(), busy.Addr().String()) {
					t.Fatalf("stderr does not name the busy address %s:\n%s", busy.Addr(), p.stderr)
				}
				entries, err := os.ReadDir(dir)
				switch {
				case !existing && !errors.Is(err, os.ErrNotExist):
					t.Fatalf("data dir %s left behind (%v): %v", dir, err, entries)
				case existing && (err != nil || len(entries) != 0):
					t.Fatalf("pre-existing data dir %s: %v, holds %v; want it kept, empty", dir, err, entries)
				}
			})
		}
	}
}

// Past etcd's space quota (--quota-backend-bytes) a write gets
// ResourceExhausted saying etcd is out of space, the log says so, reads go
// on answering with everything written before, and deletes go through.
func TestQuotaExhaustedRefusesWritesServesReads(t *testing.T) {
	env := embeddedEnv(t, filepath.Join(t.TempDir(), "data"))
	env["REGNODE_QUOTA_BACKEND_BYTES"] = strconv.Itoa(1 << 20)
	p := start(t, env)
	cc := dial(t, env["REGNODE_LISTEN"])
	waitServing(t, cc, p)
	reg := registryv1.NewRegistryClient(cc)
	ctx := context.Background()
	meta := map[string]string{}
	for i := range 14 {
		meta[fmt.Sprintf("k%d", i)] = strings.Repeat("x", 1000)
	}
	registered := 0
	var refused error
	for i := 0; i < 1000 && refused == nil; i++ {
		_, err := reg.Register(ctx, &registryv1.RegisterRequest{
			Instance: &registryv1.Instance{Service: "big", Id: fmt.Sprintf("b-%d", i), Address: "10.0.0.1:80", Metadata: meta},
			Ttl:      durationpb.New(time.Hour)})
		if err != nil {
			refused = err
			break
		}
		registered++
	}
	if refused == nil {
		t.Fatalf("1000 registrations of 14 KB fit in a 1 MiB quota")
	}
	if status.Code(refused) != codes.ResourceExhausted || !strings.Contains(refused.Error(), "out of space") {
		t.Fatalf("write past the quota: %v, want ResourceExhausted saying etcd is out of space", refused)
	}
	if registered == 0 {
		t.Fatal("the quota refused the first write: nothing to read back")
	}
	// Every page: a page holds about 1 MiB, some 70 of these records.
	listed := 0
	for token := ""; ; {
		l, err := reg.List(ctx, &registryv1.ListRequest{Service: "big", PageToken: token})
		if err != nil {
			t.Fatalf("List past the quota: %v", err)
		}
		listed += len(l.Instances)
		if token = l.NextPageToken; token == "" {
			break
		}
	}
	if listed != registered {
		t.Fatalf("List past the quota: %d instances, %d were registered", listed, registered)
	}
	if _, err := reg.Get(ctx, &registryv1.GetRequest{Service: "big", Id: "b-0"}); err != nil {
		t.Fatalf("Get past the quota: %v", err)
	}
	// Deletes free space and etcd lets them through.
	if _, err := reg.Deregister(ctx, &registryv1.DeregisterRequest{Service: "big", Id: "b-0"}); err != nil {
		t.Fatalf("Deregister past the quota: %v", err)
	}
	if _, err := reg.Get(ctx, &registryv1.GetRequest{Service: "big", Id: "b-0"}); status.Code(err) != codes.NotFound {
		t.Fatalf("Get of a deregistered instance past the quota: %v, want NotFound", err)
	}
	p.waitStderr(t, "etcd is out of space")
}

// SIGTERM stops a regnode whose etcd went away while it was between
// election terms (opening a new session waits on etcd for as long as the
// client lives), with exit 0.
func TestSignalWhileEtcdUnreachableStopsCleanly(t *testing.T) {
	m := etcdtest.Start(t, false)
	px := etcdtest.NewProxy(t, m.ClientURL)
	api := fmt.Sprintf("127.0.0.1:%d", etcdtest.FreePort(t))
	p := start(t, map[string]string{"REGNODE_ETCD_ENDPOINTS": px.URL(), "REGNODE_LISTEN": api,
		"REGNODE_METRICS_LISTEN": "off", "REGNODE_SESSION_TTL": "2s", "REGNODE_SHUTDOWN_GRACE": "500ms"})
	waitServing(t, dial(t, api), p)
	p.waitStderr(t, "msg=leading")
	px.Cut()
	p.waitStderr(t, "leadership term ended")
	if err := p.cmd.Process.Signal(syscall.SIGTERM); err != nil {
		t.Fatal(err)
	}
	if code := p.wait(t, 30*time.Second); code != 0 {
		t.Fatalf("exit %d after SIGTERM with etcd unreachable; stderr:\n%s", code, p.stderr)
	}
}

// A disk that fills up (a small tmpfs, mounted in a user namespace of the
// regnode's own) stops the regnode with a non-zero exit and a log line that
// says so: etcd cannot write its WAL or backend and exits, it has no
// read-only mode for that. Skipped where user namespaces are not allowed.
func TestFullDiskFailsLoudly(t *testing.T) {
	if err := exec.Command("unshare", "-rm", "true").Run(); err != nil {
		t.Skipf("no user namespaces here (unshare -rm: %v)", err)
	}
	dir := t.TempDir()
	env := embeddedEnv(t, filepath.Join(dir, "data"))
	// One peer writes until the disk is full: past the registrations one
	// peer may hold by default (1,500 of 14 KB fill 21 MB, not the disk).
	env["REGNODE_MAX_REGISTRATIONS_PER_PEER"] = "100000"
	// etcd preallocates 64 MiB WAL segments, the current one and the next:
	// leave room for both and 32 MiB more, no quota, so the WAL or the
	// backend runs into the end of the disk while the regnode serves.
	script := fmt.Sprintf("mount -t tmpfs -o size=160m tmpfs %s && exec %s", dir, binary)
	cmd := exec.Command("unshare", "-rm", "sh", "-c", script)
	cmd.Env = os.Environ()
	for k, v := range env {
		cmd.Env = append(cmd.Env, k+"="+v)
	}
	p := &proc{cmd: cmd, stderr: &syncBuffer{}, done: make(chan struct{})}
	cmd.Stderr = p.stderr
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	go func() { cmd.Wait(); close(p.done) }()
	t.Cleanup(func() {
		select {
		case <-p.done:
		default:
			cmd.Process.Kill()
			<-p.done
		}
	})
	cc := dial(t, env["REGNODE_LISTEN"])
	waitServing(t, cc, p)
	reg := registryv1.NewRegistryClient(cc)
	meta := map[string]string{}
	for i := range 14 {
		meta[fmt.Sprintf("k%d", i)] = strings.Repeat("x", 1000)
	}
	exited := func() bool {
		select {
		case <-p.done:
			return true
		default:
			return false
		}
	}
	var last error
	written := 0
	for i := 0; i < 5000 && !exited(); i++ {
		ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
		_, last = reg.Register(ctx, &registryv1.RegisterRequest{
			Instance: &registryv1.Instance{Service: "big", Id: fmt.Sprintf("b-%d", i), Address: "10.0.0.1:80", Metadata: meta},
			Ttl:      durationpb.New(time.Hour)})
		cancel()
		if last == nil {
			written++
		}
	}
	code := p.wait(t, 60*time.Second)
	t.Logf("exit %d after %d writes of 14 KB; last write: %v", code, written, last)
	if code == 0 || !strings.Contains(p.stderr.String(), "no space left on device") {
		t.Fatalf("full disk: exit %d, want non-zero with a line saying no space left; stderr:\n%s", code, p.stderr)
	}
}
