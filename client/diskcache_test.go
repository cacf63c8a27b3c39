package client_test

import (
	"bufio"
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"log/slog"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus/testutil"
	"google.golang.org/grpc"
	healthpb "google.golang.org/grpc/health/grpc_health_v1"

	"github.com/regcluster/registry/client"
	"github.com/regcluster/registry/internal/embedded"
	"github.com/regcluster/registry/internal/etcdtest"
	"github.com/regcluster/registry/internal/node"
	"github.com/regcluster/registry/internal/regnodetest"
)

// restartable returns a regnode config that can be stopped and started
// again on the same API port and etcd data, and its etcd client URL.
func restartable(t *testing.T) (node.Config, string) {
	t.Helper()
	cu := fmt.Sprintf("http://127.0.0.1:%d", etcdtest.FreePort(t))
	pu := fmt.Sprintf("http://127.0.0.1:%d", etcdtest.FreePort(t))
	return node.Config{Listen: fmt.Sprintf("127.0.0.1:%d", etcdtest.FreePort(t)), Embed: embedded.Config{
		Name: "rn", Dir: t.TempDir(), ListenClientURLs: []string{cu}, ListenPeerURLs: []string{pu},
		UnsafeNoFsync: true, LogLevel: "error", ProgressNotifyInterval: 500 * time.Millisecond,
	}}, cu
}

// logBuf is a concurrency-safe log sink for asserting on warnings.
type logBuf struct {
	mu sync.Mutex
	b  bytes.Buffer
}

func (l *logBuf) Write(p []byte) (int, error) {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.b.Write(p)
}

func (l *logBuf) has(s string) bool {
	l.mu.Lock()
	defer l.mu.Unlock()
	return strings.Contains(l.b.String(), s)
}

func (l *logBuf) logger() *slog.Logger {
	return slog.New(slog.NewTextHandler(l, &slog.HandlerOptions{Level: slog.LevelDebug}))
}

// servedLog is what a client logs when it serves a disk view.
const servedLog = "serving the last-known-good view from disk"

// errStaleLog is in the error a subscription logs when its cache refuses
// a unit older than its view.
const errStaleLog = "older than this subscription's view"

// saveView runs a client with CacheDir against the regnode at addr until
// its view holds want instances of orders at minRev or later, and returns
// the path of the file it wrote.
func saveView(t *testing.T, addr, dir string, want int, minRev int64) string {
	t.Helper()
	c, err := client.New(client.Config{Endpoints: []string{addr}, CacheDir: dir})
	if err != nil {
		t.Fatal(err)
	}
	sub, err := c.Subscribe(context.Background(), "orders", client.SubscribeOptions{})
	if err != nil {
		t.Fatal(err)
	}
	waitFor(t, 30*time.Second, "the view saved", func() bool {
		return len(sub.Instances("orders")) == want && sub.Revision() >= minRev
	})
	sub.Close() // the last write
	c.Close()
	path := filepath.Join(dir, "orders.lkg")
	if _, err := os.Stat(path); err != nil {
		t.Fatal(err)
	}
	if tmps, _ := filepath.Glob(filepath.Join(dir, ".*tmp*")); len(tmps) != 0 {
		t.Fatalf("temporary files left: %v", tmps)
	}
	return path
}

// childReport is what the helper process says after each command.
type childReport struct {
	OK, Failed int
	Err        string
	Known      bool
	FromDisk   bool
	SavedAt    time.Time
	IDs        []string
}

// TestDiskCacheChild is the helper process of
// TestNewProcessServesFromDiskThenLive: a client of one regnode with a
// CacheDir, dialing registry:///orders with DialOptions, driven by lines
// on stdin ("call N", "state", "quit"), answering each with a JSON line.
func TestDiskCacheChild(t *testing.T) {
	if os.Getenv("REGISTRY_LKG_CHILD") == "" {
		t.Skip("helper process of TestNewProcessServesFromDiskThenLive")
	}
	policy := client.DefaultPolicy()
	policy.SlowStartWindow = 0 // the new instance takes its share at once
	c, err := client.New(client.Config{Endpoints: []string{os.Getenv("REGISTRY_LKG_ENDPOINT")},
		CacheDir: os.Getenv("REGISTRY_LKG_DIR"), Policy: &policy, Logger: slog.New(slog.NewTextHandler(os.Stderr, nil))})
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	sub, err := c.Subscribe(context.Background(), "orders", client.SubscribeOptions{})
	if err != nil {
		t.Fatal(err)
	}
	defer sub.Close()
	cc, err := grpc.NewClient("registry:///orders", c.DialOptions()...)
	if err != nil {
		t.Fatal(err)
	}
	defer cc.Close()
	hc := healthpb.NewHealthClient(cc)
	enc := json.NewEncoder(os.Stdout)
	in := bufio.NewScanner(os.Stdin)
	for in.Scan() {
		cmd, arg, _ := strings.Cut(in.Text(), " ")
		var r childReport
		switch cmd {
		case "quit":
			return
		case "call":
			n, _ := strconv.Atoi(arg)
			for range n {
				ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
				_, err := hc.Check(ctx, &healthpb.HealthCheckRequest{})
				cancel()
				if err != nil {
					r.Failed++
					r.Err = err.Error()
				} else {
					r.OK++
				}
			}
		}
		f := sub.Freshness()
		r.Known, r.FromDisk, r.SavedAt = f.Known, f.FromDisk, f.DiskSavedAt
		for _, in := range sub.Instances("orders") {
			r.IDs = append(r.IDs, in.Id)
		}
		if err := enc.Encode(r); err != nil {
			t.Fatal(err)
		}
	}
}

// The scenario: the regnode is stopped; a NEW CLIENT PROCESS with
// CacheDir reaches the real backends from the file alone and says
// FromDisk; when the regnode comes back (same port), the live view
// replaces the file's (FromDisk false) and a change made in the registry
// reaches the process's calls.
func TestNewProcessServesFromDiskThenLive(t *testing.T) {
	cfg, cu := restartable(t)
	rn := regnodetest.StartWith(t, cfg, cu)
	b1, b2, b3 := startBackend(t), startBackend(t), startBackend(t)
	api := newClient(t, rn.Addr).API()
	register(t, api, "b1", b1.addr, 100)
	register(t, api, "b2", b2.addr, 100)
	dir := t.TempDir()
	saveView(t, rn.Addr, dir, 2, 0)
	if err := rn.Node.Close(); err != nil {
		t.Fatal(err)
	}

	child := exec.Command(os.Args[0], "-test.run=^TestDiskCacheChild$", "-test.count=1")
	child.Env = append(os.Environ(), "REGISTRY_LKG_CHILD=1", "REGISTRY_LKG_DIR="+dir, "REGISTRY_LKG_ENDPOINT="+rn.Addr)
	stdin, err := child.StdinPipe()
	if err != nil {
		t.Fatal(err)
	}
	stdout, err := child.StdoutPipe()
	if err != nil {
		t.Fatal(err)
	}
	var stderr logBuf
	child.Stderr = &stderr
	if err := child.Start(); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = child.Process.Kill(); _ = child.Wait() })
	lines := bufio.NewScanner(stdout)
	ask := func(cmd string) childReport {
		t.Helper()
		if _, err := io.WriteString(stdin, cmd+"\n"); err != nil {
			t.Fatalf("%s: %v (child stderr: %s)", cmd, err, stderr.b.String())
		}
		for lines.Scan() {
			var r childReport
			if json.Unmarshal(lines.Bytes(), &r) == nil && strings.HasPrefix(lines.Text(), "{") {
				return r
			}
		}
		t.Fatalf("%s: the child said nothing (stderr: %s)", cmd, stderr.b.String())
		return childReport{}
	}
	until := func(what, cmd string, ok func(childReport) bool) childReport {
		t.Helper()
		var r childReport
		waitFor(t, 60*time.Second, what, func() bool { r = ask(cmd); return ok(r) })
		return r
	}

	// No regnode answers: the process serves the file's view and says so.
	r := until("the disk view served", "state", func(r childReport) bool { return r.Known })
	if !r.FromDisk || r.SavedAt.IsZero() || !slices.Equal(r.IDs, []string{"b1", "b2"}) {
		t.Fatalf("before any regnode answered: %+v", r)
	}
	r = until("calls from the disk view", "call 20", func(r childReport) bool { return r.OK == 20 })
	if !r.FromDisk || b1.calls.Load() == 0 || b2.calls.Load() == 0 {
		t.Fatalf("calls did not reach both backends from the disk view: %+v, b1 %d, b2 %d", r, b1.calls.Load(), b2.calls.Load())
	}
	if !stderr.has(servedLog) {
		t.Fatalf("the child did not say it serves from disk: %s", stderr.b.String())
	}

	// The regnode comes back on the same port; a change in the registry
	// reaches the process, whose view is live again.
	rn = regnodetest.StartWith(t, cfg, cu)
	register(t, newClient(t, rn.Addr).API(), "b3", b3.addr, 100)
	r = until("the live view with b3", "state", func(r childReport) bool { return slices.Contains(r.IDs, "b3") })
	if r.FromDisk || !r.SavedAt.IsZero() {
		t.Fatalf("after the regnode answered: %+v", r)
	}
	until("calls reaching b3", "call 20", func(r childReport) bool { return r.OK == 20 && b3.calls.Load() > 0 })
	if _, err := io.WriteString(stdin, "quit\n"); err != nil {
		t.Fatal(err)
	}
	if err := child.Wait(); err != nil {
		t.Fatalf("child: %v (stderr: %s)", err, stderr.b.String())
	}
}

// A disk view saved longer ago than CacheMaxAge, or whose bytes do not
// match their checksum (here one digit of an address changed: still a
// valid record, so only the checksum tells), is ignored with a warning;
// the subscription goes on and the live view replaces the file.
func TestDiskViewIgnoredWhenTooOldOrCorrupt(t *testing.T) {
	cfg, cu := restartable(t)
	rn := regnodetest.StartWith(t, cfg, cu)
	b1 := startBackend(t)
	register(t, newClient(t, rn.Addr).API(), "b1", b1.addr, 100)
	dir := t.TempDir()
	path := saveView(t, rn.Addr, dir, 1, 0)
	if err := rn.Node.Close(); err != nil {
		t.Fatal(err)
	}
	good, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}

	ignored := func(maxAge time.Duration, warning string) (*client.Client, *client.Subscription) {
		t.Helper()
		var logs logBuf
		c, err := client.New(client.Config{Endpoints: []string{rn.Addr}, CacheDir: dir, CacheMaxAge: maxAge, Logger: logs.logger()})
		if err != nil {
			t.Fatal(err)
		}
		sub, err := c.Subscribe(context.Background(), "orders", client.SubscribeOptions{})
		if err != nil {
			t.Fatal(err)
		}
		waitFor(t, 30*time.Second, "the loader done", func() bool { return logs.has("last-known-good view ignored") || logs.has(servedLog) })
		if !logs.has(warning) {
			t.Errorf("no warning %q", warning)
		}
		if f := sub.Freshness(); f.Known || f.FromDisk || c.Metrics().Counts().DiskLoads != 0 {
			t.Fatalf("an ignored file was served: %+v, %d loads", f, c.Metrics().Counts().DiskLoads)
		}
		return c, sub
	}
	t.Run("too old", func(t *testing.T) {
		c, sub := ignored(time.Nanosecond, "over the maximum age")
		sub.Close()
		c.Close()
	})

	last := b1.addr[len(b1.addr)-1]
	altered := b1.addr[:len(b1.addr)-1] + string('0'+(last-'0'+1)%10)
	bad := bytes.Replace(good, []byte(b1.addr), []byte(altered), 1)
	if bytes.Equal(bad, good) {
		t.Fatal("address not found in the file")
	}
	if err := os.WriteFile(path, bad, 0o600); err != nil {
		t.Fatal(err)
	}
	c, sub := ignored(0, "checksum")
	defer c.Close()
	defer sub.Close()
	// The subscription was not given up: the regnode comes back and its
	// view is served, and saved over the corrupt file.
	rn = regnodetest.StartWith(t, cfg, cu)
	waitFor(t, 60*time.Second, "the live view", func() bool {
		in := sub.Instances("orders")
		return sub.Freshness().Known && len(in) == 1 && in[0].Address == b1.addr
	})
	waitFor(t, 30*time.Second, "the file replaced", func() bool {
		b, _ := os.ReadFile(path)
		return bytes.Contains(b, []byte(b1.addr))
	})
}

// Loading the file never delays subscribing (the nacos-sdk-go #519 bug):
// with the file a FIFO whose writer says nothing, the loader is stuck in
// its read, yet the live snapshot arrives and is what Instances shows;
// when the loader then gets its view (of another history, at a higher
// revision), it does not replace the live one.
func TestLoadingDoesNotDelaySubscribing(t *testing.T) {
	// The view the loader will get: of another history, at a higher
	// revision than the live one, so only the loader's own check (not the
	// cache's monotonicity) keeps it from replacing the live view.
	other := regnodetest.Start(t)
	b0, b1, b2 := startBackend(t), startBackend(t), startBackend(t)
	register(t, newClient(t, other.Addr).API(), "b0", b0.addr, 100)
	var rev int64
	for i := range 300 { // the live regnode's probes move its revision too
		resp, err := other.Etcd.Put(context.Background(), "/elsewhere", strconv.Itoa(i))
		if err != nil {
			t.Fatal(err)
		}
		rev = resp.Header.Revision
	}
	old, err := os.ReadFile(saveView(t, other.Addr, t.TempDir(), 1, rev))
	if err != nil {
		t.Fatal(err)
	}
	rn := regnodetest.Start(t)
	api := newClient(t, rn.Addr).API()
	register(t, api, "b1", b1.addr, 100)
	register(t, api, "b2", b2.addr, 100)

	dir := t.TempDir()
	fifo := filepath.Join(dir, "orders.lkg")
	if err := syscall.Mkfifo(fifo, 0o600); err != nil {
		t.Fatal(err)
	}
	// Held read-write, the FIFO opens at once (Linux) and the loader's
	// read blocks until w is written and closed: no goroutine of the test
	// can hang in open, whatever the loader does.
	w, err := os.OpenFile(fifo, os.O_RDWR, 0)
	if err != nil {
		t.Fatal(err)
	}
	release := sync.OnceFunc(func() { w.Close() })
	defer release()
	var logs logBuf
	c, err := client.New(client.Config{Endpoints: []string{rn.Addr}, CacheDir: dir, Logger: logs.logger()})
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	subc := make(chan *client.Subscription, 1)
	go func() {
		sub, err := c.Subscribe(context.Background(), "orders", client.SubscribeOptions{})
		if err != nil {
			t.Error(err)
		}
		subc <- sub
	}()
	// The loader has opened the FIFO when a second descriptor of this
	// process refers to it.
	waitFor(t, 30*time.Second, "the loader to open the file", func() bool { return openCount(t, w) >= 2 })
	var sub *client.Subscription
	select {
	case sub = <-subc:
	case <-time.After(30 * time.Second):
		release()
		t.Fatal("Subscribe waited for the file")
	}
	if sub == nil {
		t.FailNow()
	}
	defer sub.Close()
	defer release() // first: Close waits for the loader
	if n := openCount(t, w); n < 2 {
		t.Fatalf("the FIFO is open %d times: the loader is not reading it, the test proves less", n)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	if err := sub.WaitReady(ctx); err != nil {
		t.Fatalf("no live snapshot while the file was being read: %v", err)
	}
	if f := sub.Freshness(); f.FromDisk {
		t.Fatalf("first view: %+v", f)
	}
	// The regnode's view may trail the registrations a moment.
	waitFor(t, 30*time.Second, "both live instances", func() bool { return len(sub.Instances("orders")) == 2 })
	if sub.Revision() >= rev {
		t.Fatalf("the live view at %d is not below the file's %d: the test proves less", sub.Revision(), rev)
	}

	if _, err := w.Write(old); err != nil {
		t.Fatal(err)
	}
	release()
	waitFor(t, 30*time.Second, "the loader done", func() bool { return logs.has("a regnode answered first") || logs.has(servedLog) })
	if f := sub.Freshness(); f.FromDisk || len(sub.Instances("orders")) != 2 || c.Metrics().Counts().DiskLoads != 0 {
		t.Fatalf("the disk view replaced the live one: %+v, %d instances", f, len(sub.Instances("orders")))
	}
}

// A file of another history at a HIGHER revision than the regnode that
// answers (another cluster, or etcd rebuilt) is served until then, and
// its live snapshot replaces it although the revision goes down: the
// revision-monotonic cache must not refuse it, and the resolver pushes
// it (calls reach the instance only the live view has).
func TestDiskViewOfAnotherHistoryReplaced(t *testing.T) {
	cfgA, cu := restartable(t)
	rnA := regnodetest.StartWith(t, cfgA, cu)
	b1, b2 := startBackend(t), startBackend(t)
	register(t, newClient(t, rnA.Addr).API(), "b1", b1.addr, 100)
	var rev int64
	for i := range 50 { // push history A's revision well above B's
		resp, err := rnA.Etcd.Put(context.Background(), "/elsewhere", strconv.Itoa(i))
		if err != nil {
			t.Fatal(err)
		}
		rev = resp.Header.Revision
	}
	dir := t.TempDir()
	saveView(t, rnA.Addr, dir, 1, rev) // progress messages bring the view there
	if err := rnA.Node.Close(); err != nil {
		t.Fatal(err)
	}

	var logs logBuf
	c, err := client.New(client.Config{Endpoints: []string{rnA.Addr}, CacheDir: dir, Policy: noSlowStart(), Logger: logs.logger(),
		WatchPerSubscription: watchPerSubscription})
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	sub, err := c.Subscribe(context.Background(), "orders", client.SubscribeOptions{})
	if err != nil {
		t.Fatal(err)
	}
	defer sub.Close()
	cc, err := grpc.NewClient("registry:///orders", c.DialOptions()...)
	if err != nil {
		t.Fatal(err)
	}
	defer cc.Close()
	waitFor(t, 30*time.Second, "the disk view", func() bool { return sub.Freshness().FromDisk })
	diskRev := sub.Revision()
	if m := c.Metrics().Counts(); m.DiskLoads != 1 || m.DiskSavedAt["orders"].IsZero() {
		t.Fatalf("disk load not counted: %d loads, saved at %v", m.DiskLoads, m.DiskSavedAt)
	}
	if n := testutil.CollectAndCount(c.Metrics(), "registry_client_disk_cache_age_seconds"); n != 1 {
		t.Fatalf("%d disk age series while served from disk", n)
	}

	cfgB := cfgA // the same ports, a new etcd: another history
	cfgB.Embed.Dir = t.TempDir()
	rnB := regnodetest.StartWith(t, cfgB, cu)
	register(t, newClient(t, rnB.Addr).API(), "b2", b2.addr, 100)
	waitFor(t, 60*time.Second, "the live view of history B", func() bool {
		in := sub.Instances("orders")
		return !sub.Freshness().FromDisk && len(in) == 1 && in[0].Id == "b2"
	})
	if sub.Revision() >= diskRev {
		t.Fatalf("history B at revision %d is not below the file's %d: the test proves nothing", sub.Revision(), diskRev)
	}
	// The live snapshot replaced the disk view as it came: not refused
	// first by the revision-monotonic cache (and then mended by the
	// Subscribe stream's reseeding, or by a stream error and a resync).
	for _, refused := range []string{"subscription refused", errStaleLog} {
		if logs.has(refused) {
			t.Fatalf("the live snapshot was refused before it replaced the disk view (log has %q)", refused)
		}
	}
	if n := testutil.CollectAndCount(c.Metrics(), "registry_client_disk_cache_age_seconds"); n != 0 {
		t.Fatalf("%d disk age series once live", n)
	}
	hc := healthpb.NewHealthClient(cc)
	waitFor(t, 30*time.Second, "calls reaching b2", func() bool {
		ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
		defer cancel()
		_, err := hc.Check(ctx, &healthpb.HealthCheckRequest{})
		return err == nil && b2.calls.Load() > 0
	})
}

// openCount is how many descriptors of this process refer to f's file
// (compared by device and inode: a rename of its path does not matter).
func openCount(t *testing.T, f *os.File) int {
	t.Helper()
	var want syscall.Stat_t
	if err := syscall.Fstat(int(f.Fd()), &want); err != nil {
		t.Fatal(err)
	}
	fds, err := os.ReadDir("/proc/self/fd")
	if err != nil {
		t.Fatal(err)
	}
	n := 0
	for _, fd := range fds {
		var st syscall.Stat_t
		if syscall.Stat(filepath.Join("/proc/self/fd", fd.Name()), &st) == nil && st.Dev == want.Dev && st.Ino == want.Ino {
			n++
		}
	}
	return n
}
