package main_test

import (
	"bytes"
	"context"
	"fmt"
	"io"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials/insecure"
	healthpb "google.golang.org/grpc/health/grpc_health_v1"
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
