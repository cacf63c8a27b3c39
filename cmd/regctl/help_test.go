package main

import (
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"
	"unsafe"

	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
)

// refusedAddr is a loopback port nobody listens on.
func refusedAddr(t *testing.T) string {
	t.Helper()
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	addr := l.Addr().String()
	l.Close()
	return addr
}

// TestUnreachableHint checks that an unreachable regnode's error line says
// how to point regctl elsewhere, worded by where the endpoints came from,
// and that other errors carry no such hint.
func TestUnreachableHint(t *testing.T) {
	refused := refusedAddr(t)
	r := regctl(t, nil, "--endpoints", refused, "--timeout", "2s", "list")
	mustFail(t, r, 1, "cannot reach a regnode at "+refused)
	if !strings.Contains(r.stderr, "check --endpoints") || !strings.Contains(r.stderr, "REGCTL_ENDPOINTS") {
		t.Errorf("--endpoints given: want a hint naming --endpoints and REGCTL_ENDPOINTS; %v", r)
	}
	r = regctl(t, environ(envEndpoints+"="+refused), "--timeout", "2s", "services")
	mustFail(t, r, 1, "cannot reach a regnode at "+refused)
	if !strings.Contains(r.stderr, "came from $REGCTL_ENDPOINTS") || !strings.Contains(r.stderr, "--endpoints host:port") {
		t.Errorf("REGCTL_ENDPOINTS given: want a hint saying so; %v", r)
	}

	// The default endpoint may have a regnode on this machine: the
	// wording for it is checked without dialling.
	o := &options{endpoints: []string{"127.0.0.1:7400"}, endpointsFrom: "default", timeout: time.Second}
	dial := status.Error(codes.Unavailable, `connection error: desc = "transport: Error while dialing: dial tcp 127.0.0.1:7400: connect: connection refused"`)
	if h := hint(dial, o); !strings.Contains(h, "only the default") || !strings.Contains(h, "--endpoints") || !strings.Contains(h, "$REGCTL_ENDPOINTS") {
		t.Errorf("default endpoint: hint = %q", h)
	}
	if h := hint(&gaveUpError{msg: "could not register", last: fmt.Errorf("register a/b: %w", dial)}, o); h == "" {
		t.Error("a registration that gave up on an unreachable regnode has no hint")
	}
	for _, err := range []error{
		status.Error(codes.Unavailable, "etcdserver: no leader"), // a regnode answered
		&notFoundError{"orders", "o-1"},
		&gaveUpError{msg: "could not register", last: status.Error(codes.Unavailable, "etcdserver: no leader")},
		errors.New("something else"),
	} {
		if h := hint(err, o); h != "" {
			t.Errorf("hint(%v) = %q, want none", err, h)
		}
	}
}

// openPTY returns the master and slave ends of a new pseudo-terminal.
func openPTY(t *testing.T) (master, slave *os.File) {
	t.Helper()
	m, err := os.OpenFile("/dev/ptmx", os.O_RDWR|syscall.O_NOCTTY, 0)
	if err != nil {
		t.Skipf("no pseudo-terminal here: %v", err)
	}
	var unlock int32
	if _, _, e := syscall.Syscall(syscall.SYS_IOCTL, m.Fd(), syscall.TIOCSPTLCK, uintptr(unsafe.Pointer(&unlock))); e != 0 {
		m.Close()
		t.Fatalf("unlockpt: %v", e)
	}
	var n uint32
	if _, _, e := syscall.Syscall(syscall.SYS_IOCTL, m.Fd(), syscall.TIOCGPTN, uintptr(unsafe.Pointer(&n))); e != 0 {
		m.Close()
		t.Fatalf("ptsname: %v", e)
	}
	s, err := os.OpenFile(fmt.Sprintf("/dev/pts/%d", n), os.O_RDWR|syscall.O_NOCTTY, 0)
	if err != nil {
		m.Close()
		t.Fatalf("open pts: %v", err)
	}
	return m, s
}

// TestRegisterSaysStillTrying checks that `regctl register` on a terminal
// says it is still trying while the regnode is down, before the final
// error, and that on a pipe (TestUnreachable) the error stays one line.
func TestRegisterSaysStillTrying(t *testing.T) {
	master, slave := openPTY(t)
	defer master.Close()
	refused := refusedAddr(t)
	cmd := exec.Command(binary(t), "--endpoints", refused, "--timeout", "2s",
		"register", "--service", "web", "--id", "w-1", "--address", "127.0.0.1:1")
	cmd.Env = environ()
	var stdout strings.Builder
	cmd.Stdout, cmd.Stderr = &stdout, slave
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	slave.Close() // the child holds it now: the master reads EIO once it exits
	out, _ := io.ReadAll(master)
	err := cmd.Wait()
	var ee *exec.ExitError
	if !errors.As(err, &ee) || ee.ExitCode() != 1 {
		t.Fatalf("want exit 1, got %v; terminal:\n%s", err, out)
	}
	lines := strings.Split(strings.TrimSpace(strings.ReplaceAll(string(out), "\r", "")), "\n")
	if len(lines) != 2 {
		t.Fatalf("want 2 lines on the terminal (still trying, then the error), got %d:\n%s", len(lines), out)
	}
	if want := "cannot reach a regnode at " + refused; !strings.Contains(lines[0], want) || !strings.Contains(lines[0], "still trying to register web/w-1 for up to 2s") {
		t.Errorf("first line %q: want %q and that it is still trying", lines[0], want)
	}
	if !strings.Contains(lines[1], "could not register web/w-1 within 2s") || !strings.Contains(lines[1], "--endpoints") {
		t.Errorf("last line %q: want the failure with a hint", lines[1])
	}
	if stdout.Len() != 0 {
		t.Errorf("stdout: %q, want nothing", stdout.String())
	}
}

// TestVersion checks `regctl version` against the build: without VCS
// stamping it says the revision is unknown; built the way `make build`
// builds it (-buildvcs=true in a git checkout) it prints the checkout's
// HEAD.
func TestVersion(t *testing.T) {
	r := mustOK(t, regctl(t, nil, "version", "-o", "json"))
	var in struct{ Module, Version, Revision, Go string }
	if err := json.Unmarshal([]byte(r.stdout), &in); err != nil {
		t.Fatalf("version -o json: %v; %v", err, r)
	}
	if in.Module != "github.com/regcluster/registry" || in.Version == "" || in.Go == "" {
		t.Errorf("version -o json = %+v", in)
	}

	head, err := exec.Command("git", "rev-parse", "HEAD").Output()
	if err != nil {
		t.Skipf("not a git checkout (%v): VCS stamping cannot be checked", err)
	}
	top, err := exec.Command("git", "rev-parse", "--show-toplevel").Output()
	if err != nil {
		t.Fatal(err)
	}
	// The go command finds a repository by a .git directory: a linked
	// work tree (.git is a file) is built unstamped even with
	// -buildvcs=true, and must say so.
	fi, err := os.Stat(filepath.Join(strings.TrimSpace(string(top)), ".git"))
	stamped := err == nil && fi.IsDir()
	bin := filepath.Join(t.TempDir(), "regctl-vcs")
	if out, err := exec.Command("go", "build", "-buildvcs=true", "-o", bin, ".").CombinedOutput(); err != nil {
		t.Fatalf("go build -buildvcs=true: %v\n%s", err, out)
	}
	out, err := exec.Command(bin, "version").Output()
	if err != nil {
		t.Fatalf("regctl version: %v", err)
	}
	// Stamped, the version is a pseudo-version from the commit; without
	// a repository, "(devel)".
	want := ", revision " + strings.TrimSpace(string(head))
	if !stamped {
		t.Logf("a linked git work tree: the build cannot be stamped")
		want = " (devel), revision unknown"
	}
	if s := string(out); !strings.HasPrefix(s, "regctl github.com/regcluster/registry ") || !strings.Contains(s, want) {
		t.Errorf("built with -buildvcs=true: version = %q, want the module and %q", out, want)
	}
}

// TestCompletion checks that cobra's completion scripts, documented in
// docs/regctl.md, are there for each shell.
func TestCompletion(t *testing.T) {
	for shell, marker := range map[string]string{"bash": "__start_regctl", "zsh": "#compdef regctl", "fish": "complete -c regctl", "powershell": "Register-ArgumentCompleter"} {
		r := mustOK(t, regctl(t, nil, "completion", shell))
		if !strings.Contains(r.stdout, marker) {
			t.Errorf("completion %s: no %q in the script", shell, marker)
		}
	}
	// A completion request for a command name lists it.
	r := regctl(t, nil, "__complete", "ver")
	if r.code != 0 || !strings.Contains(r.stdout, "version") {
		t.Errorf("__complete ver: want version offered; %v", r)
	}
}
