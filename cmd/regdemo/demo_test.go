package main

import (
	"bufio"
	"bytes"
	"context"
	"errors"
	"io"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"go.uber.org/goleak"

	"github.com/regcluster/registry/internal/etcdtest"
)

// mainArg, as the first argument, makes the test binary regdemo itself,
// so a test can send it a real SIGINT.
const mainArg = "__regdemo-main"

// TestMain lets the test binary stand in for regdemo's child backend
// (which regdemo re-executes from os.Executable()) and for regdemo.
func TestMain(m *testing.M) {
	if len(os.Args) > 1 {
		switch os.Args[1] {
		case childArg:
			os.Exit(childMain(os.Args[2:], os.Stdin, os.Stdout))
		case mainArg:
			os.Exit(mainWith(os.Args[2:], os.Stdin, os.Stdout, os.Stderr))
		}
	}
	os.Exit(m.Run())
}

// The scripted story, in this process (C in a child process), with the
// facts the demo exists to show, from its summary: counts, not times.
func TestStory(t *testing.T) {
	defer goleak.VerifyNone(t, etcdtest.LeakOptions()...)
	tmp := t.TempDir()
	t.Setenv("TMPDIR", tmp) // the stack's temp dir goes here: it must be gone after
	var buf bytes.Buffer
	out := &syncWriter{w: &buf}
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Minute)
	defer cancel()
	sum, err := RunStory(ctx, DefaultSettings(), out)
	if err != nil {
		t.Fatalf("story: %v\n%s", err, out.String())
	}
	t.Logf("summary:\n%s", tail(out.String(), "Summary"))

	healthy := sum.ByKey(KeyHealthy)
	if healthy.Failed != 0 || healthy.Answers["A"] < healthy.Answers["B"]+healthy.Answers["C"]-2 ||
		healthy.Answers["B"] == 0 || healthy.Answers["C"] == 0 {
		t.Errorf("all healthy: want A (200) about as many answers as B and C (100 each) together, none failed: %+v", healthy)
	}

	failing, out1 := sum.ByKey(KeyAFailing), sum.ByKey(KeyAOut)
	if !sum.ClientEjectedA || sum.Ejections < 1 {
		t.Errorf("the client did not eject A before the registry marked it (ejections %d)", sum.Ejections)
	}
	if failing.FailedAt["A"] < 1 || failing.Failed+out1.Failed != 0 {
		t.Errorf("A failing: want failed attempts on A, all retried (no call failed): %+v", failing)
	}
	if out1.Calls < 10 || out1.Attempts["A"]*20 > out1.Calls {
		t.Errorf("A out of rotation: %d of %d calls still tried A (want at most 5%%)", out1.Attempts["A"], out1.Calls)
	}

	half, full := sum.ByKey(KeyAHalf), sum.ByKey(KeyAFull)
	if half.Answers["A"]+sum.ByKey(KeyARamp).Answers["A"] == 0 || full.Answers["A"]*3 < full.Calls {
		t.Errorf("A did not come back: half-open %+v, full weight %+v", half, full)
	}
	// The first step of the ramp long enough to hold calls (a DEGRADED
	// quarter-weight step can be short).
	var firstRamp *PhaseStats
	for i := range sum.Phases {
		if sum.Phases[i].Key == KeyARamp && sum.Phases[i].Calls >= 10 {
			firstRamp = &sum.Phases[i]
			break
		}
	}
	if firstRamp == nil || firstRamp.Answers["A"]*full.Calls >= full.Answers["A"]*firstRamp.Calls {
		t.Errorf("no slow-start ramp: first ramp phase %+v, full weight %+v", firstRamp, full)
	}

	drained := sum.ByKey(KeyBDrained)
	if drained.Calls < 30 || drained.Attempts["B"] != 0 {
		t.Errorf("after the drain reached the client, %d of %d calls went to B", drained.Attempts["B"], drained.Calls)
	}

	killed := sum.ByKey(KeyCKilled)
	if killed.Calls < 10 || killed.Failed != 0 {
		t.Errorf("after kill -9 C, %d of %d calls failed", killed.Failed, killed.Calls)
	}
	if killed.FailedAt["C"] < 1 || killed.Retried < 1 {
		t.Errorf("C was not killed with a call in flight that was retried: %+v", killed)
	}

	if left, _ := os.ReadDir(tmp); len(left) != 0 {
		t.Errorf("left in the temp dir: %v", left)
	}
	if kids := children(t); len(kids) != 0 {
		t.Errorf("child processes left: %v", kids)
	}
}

// Ctrl-C in the middle of the story, to regdemo as a process: exit 130,
// C's process gone, the temp dir removed.
func TestInterruptLeavesNothing(t *testing.T) {
	tmp := t.TempDir()
	cmd := exec.Command(os.Args[0], mainArg)
	cmd.Env = append(os.Environ(), "TMPDIR="+tmp)
	var stderr bytes.Buffer
	cmd.Stderr = &stderr
	// A pipe of our own, read to the end below, so Wait never waits on
	// a reader that stopped.
	stdout, pw := io.Pipe()
	cmd.Stdout = pw
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	defer cmd.Process.Kill()
	drained := make(chan struct{})
	pidRe := regexp.MustCompile(`backend C on \S+ \(pid (\d+);`)
	sc := bufio.NewScanner(stdout)
	var pid int
	var seen []string
	for sc.Scan() {
		line := sc.Text()
		seen = append(seen, line)
		if m := pidRe.FindStringSubmatch(line); m != nil {
			pid, _ = strconv.Atoi(m[1])
		}
		if strings.Contains(line, " call 3 ") {
			break
		}
	}
	if pid == 0 {
		t.Fatalf("no call 3, or no pid of C, in:\n%s\nstderr:\n%s", strings.Join(seen, "\n"), stderr.String())
	}
	if err := syscall.Kill(pid, 0); err != nil {
		t.Fatalf("C (pid %d) not running before the interrupt: %v", pid, err)
	}
	if err := cmd.Process.Signal(os.Interrupt); err != nil {
		t.Fatal(err)
	}
	go func() { defer close(drained); _, _ = io.Copy(io.Discard, stdout) }()
	err := cmd.Wait()
	pw.Close()
	<-drained
	var ee *exec.ExitError
	if !errors.As(err, &ee) || ee.ExitCode() != 130 {
		t.Fatalf("after SIGINT: %v, want exit 130; stderr:\n%s", err, stderr.String())
	}
	if err := syscall.Kill(pid, 0); !errors.Is(err, syscall.ESRCH) {
		t.Errorf("C (pid %d) still there after the interrupt: %v", pid, err)
	}
	if left, _ := os.ReadDir(tmp); len(left) != 0 {
		t.Errorf("left in the temp dir: %v", left)
	}
}

// Bad flags: exit 2, a message naming the flag, nothing started.
func TestUsage(t *testing.T) {
	for _, args := range [][]string{{"-bogus"}, {"-ttl", "1s"}, {"-slow-start", "-1s"}, {"extra"}} {
		var stdout, stderr bytes.Buffer
		if code := mainWith(args, strings.NewReader(""), &stdout, &stderr); code != 2 {
			t.Errorf("%v: exit %d, want 2", args, code)
		}
		if stderr.Len() == 0 || stdout.Len() != 0 {
			t.Errorf("%v: stderr %q, stdout %q", args, stderr.String(), stdout.String())
		}
	}
	var stderr bytes.Buffer
	mainWith([]string{"-ttl", "1s"}, strings.NewReader(""), new(bytes.Buffer), &stderr)
	if !strings.Contains(stderr.String(), "-ttl") {
		t.Errorf("the message does not name the flag: %q", stderr.String())
	}
}

// children lists this process's child processes (Linux; none elsewhere).
func children(t *testing.T) []string {
	tasks, err := filepath.Glob("/proc/self/task/*/children")
	if err != nil || len(tasks) == 0 {
		t.Log("no /proc: child processes not checked")
		return nil
	}
	var out []string
	for _, f := range tasks {
		b, err := os.ReadFile(f)
		if err == nil {
			out = append(out, strings.Fields(string(b))...)
		}
	}
	return out
}

func tail(s, from string) string {
	if i := strings.Index(s, from); i >= 0 {
		return s[i:]
	}
	return s
}

// String is what was written so far.
func (s *syncWriter) String() string {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.w.(*bytes.Buffer).String()
}

// -interactive takes the seed's commands: a bad one is refused and
// named, kill C kills C's process, quit stops everything cleanly.
func TestInteractive(t *testing.T) {
	defer goleak.VerifyNone(t, etcdtest.LeakOptions()...)
	tmp := t.TempDir()
	t.Setenv("TMPDIR", tmp)
	var buf bytes.Buffer
	out := &syncWriter{w: &buf}
	in, cmds := io.Pipe()
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	done := make(chan error, 1)
	go func() { done <- RunInteractive(ctx, DefaultSettings(), in, out) }()
	waitOut := func(s string) {
		t.Helper()
		for !strings.Contains(out.String(), s) {
			select {
			case err := <-done:
				t.Fatalf("ended before %q: %v\n%s", s, err, out.String())
			case <-ctx.Done():
				t.Fatalf("no %q in:\n%s", s, out.String())
			case <-time.After(20 * time.Millisecond):
			}
		}
	}
	send := func(line string) {
		t.Helper()
		if _, err := io.WriteString(cmds, line+"\n"); err != nil {
			t.Fatal(err)
		}
	}
	waitOut(" call 1 ")
	pid := 0
	if m := regexp.MustCompile(`pid (\d+)`).FindStringSubmatch(out.String()); m == nil {
		t.Fatalf("no pid of C in:\n%s", out.String())
	} else {
		pid, _ = strconv.Atoi(m[1])
	}
	send("frobnicate")
	waitOut(`!! unknown command "frobnicate"`)
	send("kill A")
	waitOut("!! only C runs in a process of its own")
	send("kill C")
	waitOut("C killed (SIGKILL)")
	if err := syscall.Kill(pid, 0); !errors.Is(err, syscall.ESRCH) {
		t.Errorf("C (pid %d) still there after kill C: %v", pid, err)
	}
	send("status")
	waitOut("after: kill C")
	send("quit")
	if err := <-done; err != nil {
		t.Fatalf("quit: %v", err)
	}
	cmds.Close()
	if left, _ := os.ReadDir(tmp); len(left) != 0 {
		t.Errorf("left in the temp dir: %v", left)
	}
}

// Close of a running stack stops C's process (reaped, not left to the
// kernel's parent-death signal) and removes the temp dir.
func TestCloseStopsEverything(t *testing.T) {
	defer goleak.VerifyNone(t, etcdtest.LeakOptions()...)
	tmp := t.TempDir()
	t.Setenv("TMPDIR", tmp)
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	st, err := StartStack(ctx, DefaultSettings(), &syncWriter{w: new(bytes.Buffer)})
	if err != nil {
		t.Fatal(err)
	}
	if kids := children(t); len(kids) != 1 || kids[0] != strconv.Itoa(st.CPid()) {
		st.Close()
		t.Fatalf("children %v, want C's pid %d", kids, st.CPid())
	}
	if left, _ := os.ReadDir(tmp); len(left) != 1 {
		t.Errorf("want the stack's one temp dir, got %v", left)
	}
	st.Close()
	if kids := children(t); len(kids) != 0 {
		t.Errorf("child processes left after Close: %v", kids)
	}
	if left, _ := os.ReadDir(tmp); len(left) != 0 {
		t.Errorf("left in the temp dir after Close: %v", left)
	}
}
