package httpapi_test

import (
	"bufio"
	"context"
	"encoding/json"
	"io"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/regcluster/registry/client"
	registryv1 "github.com/regcluster/registry/proto/registry/v1"
)

// pyExample runs docs/examples/http_register.py against f as a child
// process, and returns it once it says it registered (its stdout line).
// Without python3 the test is skipped, unless REGISTRY_REQUIRE_PYTHON=1.
func pyExample(t *testing.T, f *fixture, args ...string) (*exec.Cmd, chan error, *lockedBuffer) {
	t.Helper()
	py, err := exec.LookPath("python3")
	if err != nil {
		if os.Getenv("REGISTRY_REQUIRE_PYTHON") == "1" {
			t.Fatalf("REGISTRY_REQUIRE_PYTHON=1 but no python3: %v", err)
		}
		t.Skip("no python3 (REGISTRY_REQUIRE_PYTHON=1 makes this a failure)")
	}
	script, err := filepath.Abs("../docs/examples/http_register.py")
	if err != nil {
		t.Fatal(err)
	}
	cmd := exec.Command(py, append([]string{script, "--regnode", f.base}, args...)...)
	stderr := &lockedBuffer{}
	cmd.Stderr = stderr
	stdout, err := cmd.StdoutPipe()
	if err != nil {
		t.Fatal(err)
	}
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	done := make(chan error, 1)
	lines := make(chan string, 1)
	go func() {
		sc := bufio.NewScanner(stdout)
		if sc.Scan() {
			lines <- sc.Text()
		}
		io.Copy(io.Discard, stdout)
		done <- cmd.Wait()
	}()
	t.Cleanup(func() {
		cmd.Process.Kill()
		<-done
	})
	select {
	case line := <-lines:
		var said struct {
			Registered string `json:"registered"`
		}
		if err := json.Unmarshal([]byte(line), &said); err != nil || said.Registered == "" {
			t.Fatalf("the example said %q; stderr:\n%s", line, stderr)
		}
	case err := <-done:
		t.Fatalf("the example exited (%v) without registering; stderr:\n%s", err, stderr)
	case <-time.After(30 * time.Second):
		t.Fatalf("the example did not register in 30s; stderr:\n%s", stderr)
	}
	return cmd, done, stderr
}

// The Python example registers over HTTP, renews at a third of its 2s
// TTL for longer than three TTLs (an SDK subscriber sees it the whole
// time, under one lease), and on SIGTERM deregisters at once; SIGKILLed,
// it deregisters nothing and its record leaves with its lease.
func TestPythonExampleRegistersOverHTTP(t *testing.T) {
	f := start(t)
	c, err := client.New(client.Config{Endpoints: []string{f.rn.Addr}})
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	sub, err := c.Subscribe(ctx, "py", client.SubscribeOptions{})
	if err != nil {
		t.Fatal(err)
	}
	if err := sub.WaitReady(ctx); err != nil {
		t.Fatal(err)
	}
	seen := func(id string) *registryv1.Instance {
		for _, in := range sub.Instances("py") {
			if in.Id == id {
				return in
			}
		}
		return nil
	}

	// A 5s TTL (renewed every 1.7s): a loaded machine that delays one
	// renewal past a 2s TTL's margin must not fail the test.
	cmd, done, stderr := pyExample(t, f, "--service", "py", "--id", "p-1", "--address", "127.0.0.1:9901", "--ttl", "5s",
		"--meta", "metrics_port=9100", "--check", "tcp")
	waitUntil(t, 10*time.Second, "the subscriber to see p-1", stderr, func() bool { return seen("p-1") != nil })
	first := seen("p-1")
	if first.Metadata["metrics_port"] != "9100" || first.Check.GetKind() != registryv1.CheckKind_CHECK_KIND_TCP {
		t.Errorf("p-1 as the subscriber sees it: %v", first)
	}
	// Past three TTLs, p-1 never leaves and keeps its lease: renewed.
	for until := time.Now().Add(16 * time.Second); time.Now().Before(until); time.Sleep(50 * time.Millisecond) {
		if in := seen("p-1"); in == nil || in.LeaseId != first.LeaseId {
			t.Fatalf("p-1 left or changed lease while renewed: %v; stderr:\n%s", in, stderr)
		}
	}
	if err := cmd.Process.Signal(syscall.SIGTERM); err != nil {
		t.Fatal(err)
	}
	select {
	case err := <-done:
		done <- err // for the cleanup
		if err != nil {
			t.Fatalf("the example exited with %v on SIGTERM; stderr:\n%s", err, stderr)
		}
	case <-time.After(20 * time.Second):
		t.Fatalf("the example did not exit on SIGTERM; stderr:\n%s", stderr)
	}
	// Deregistered, not expired: gone well within the TTL.
	if r, err := f.rn.Etcd.Get(ctx, f.rn.Prefix+"instances/py/p-1"); err != nil || len(r.Kvs) != 0 {
		t.Errorf("p-1 still in etcd after the example's SIGTERM: %v %v", r, err)
	}
	waitUntil(t, 10*time.Second, "the subscriber to see p-1 leave", stderr, func() bool { return seen("p-1") == nil })
	if !strings.Contains(stderr.String(), "deregistered py/p-1") {
		t.Errorf("the example did not say it deregistered:\n%s", stderr)
	}

	cmd, _, stderr = pyExample(t, f, "--service", "py", "--id", "p-2", "--address", "127.0.0.1:9902", "--ttl", "2s")
	waitUntil(t, 10*time.Second, "the subscriber to see p-2", stderr, func() bool { return seen("p-2") != nil })
	if err := cmd.Process.Kill(); err != nil {
		t.Fatal(err)
	}
	killed := time.Now()
	if seen("p-2") == nil {
		t.Fatal("p-2 left at once on SIGKILL: nothing should have deregistered it")
	}
	waitUntil(t, 30*time.Second, "p-2 to leave with its lease", stderr, func() bool { return seen("p-2") == nil })
	if d := time.Since(killed); d < time.Second {
		t.Errorf("p-2 left %s after SIGKILL, sooner than its lease could expire", d)
	}
}
