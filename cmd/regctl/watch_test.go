package main

// Tests of `regctl watch`: the real binary as a subprocess, following real
// regnodes.

import (
	"bytes"
	"context"
	"encoding/json"
	"io"
	"net"
	"os"
	"os/exec"
	"slices"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"google.golang.org/protobuf/types/known/durationpb"

	"github.com/regcluster/registry/cache"
	"github.com/regcluster/registry/client"
	"github.com/regcluster/registry/internal/etcdtest"
	"github.com/regcluster/registry/internal/node"
	"github.com/regcluster/registry/internal/regnodetest"
	"github.com/regcluster/registry/internal/render"
	registryv1 "github.com/regcluster/registry/proto/registry/v1"
)

// lineWait bounds every wait for one line of watch output.
const lineWait = 30 * time.Second

// syncBuffer is a bytes.Buffer a process writes to while the test reads.
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

// watchProc is a running `regctl ... watch`.
type watchProc struct {
	cmd    *exec.Cmd
	out    *lineReader
	stderr *syncBuffer
	exited bool
	// lines are every stdout line read so far.
	lines []string
}

// startWatch runs regctl with args (which should include the watch
// command) and kills it when the test ends if it is still running.
func startWatch(t *testing.T, args ...string) *watchProc {
	t.Helper()
	cmd := exec.Command(binary(t), args...)
	cmd.Env = environ()
	w := &watchProc{cmd: cmd, stderr: &syncBuffer{}}
	cmd.Stderr = w.stderr
	w.out = readLines(t, cmd)
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		if !w.exited {
			cmd.Process.Kill()
			w.out.rest(t, 10*time.Second)
			cmd.Wait()
		}
	})
	return w
}

// next returns the next stdout line.
func (w *watchProc) next(t *testing.T) string {
	t.Helper()
	l := w.out.next(t, lineWait)
	w.lines = append(w.lines, l)
	return l
}

// stop sends sig, waits for the process and checks that it exited 0; it
// returns the lines printed after the signal.
func (w *watchProc) stop(t *testing.T, sig os.Signal) []string {
	t.Helper()
	if err := w.cmd.Process.Signal(sig); err != nil {
		t.Fatal(err)
	}
	rest := w.out.rest(t, lineWait)
	w.lines = append(w.lines, rest...)
	err := w.cmd.Wait()
	w.exited = true
	if err != nil {
		t.Fatalf("watch exited with %v after %v; stderr %q; stdout %q", err, sig, w.stderr.String(), w.lines)
	}
	return rest
}

// jsonWatch reads `watch -o json` lines, checking each as it comes: valid
// JSON of one of the four types with exactly that type's keys, and a
// revision that never goes down.
type jsonWatch struct {
	*watchProc
	rev       int64
	all       []render.WatchLine
	progress  int // progress lines seen
	snapshots int
}

// nextJSON returns the next line that is not progress.
func (w *jsonWatch) nextJSON(t *testing.T) render.WatchLine {
	t.Helper()
	for {
		l := w.nextAny(t)
		if l.Type != render.WatchProgress {
			return l
		}
	}
}

// nextAny returns the next line, progress included.
func (w *jsonWatch) nextAny(t *testing.T) render.WatchLine {
	t.Helper()
	raw := w.next(t)
	l := checkWatchLine(t, raw)
	if l.Revision < w.rev && !l.NewEpoch {
		t.Fatalf("revision went down from %d to %d: %s", w.rev, l.Revision, raw)
	}
	w.rev = l.Revision
	w.all = append(w.all, l)
	switch l.Type {
	case render.WatchProgress:
		w.progress++
	case render.WatchSnapshot:
		w.snapshots++
	}
	return l
}

// checkWatchLine decodes one JSON line and checks its keys against
// docs/architecture.md.
func checkWatchLine(t *testing.T, raw string) render.WatchLine {
	t.Helper()
	var m map[string]json.RawMessage
	if err := json.Unmarshal([]byte(raw), &m); err != nil {
		t.Fatalf("watch line %q is not a JSON object: %v", raw, err)
	}
	dec := json.NewDecoder(strings.NewReader(raw))
	dec.DisallowUnknownFields()
	var l render.WatchLine
	if err := dec.Decode(&l); err != nil {
		t.Fatalf("watch line %q: %v", raw, err)
	}
	want := map[string][]string{
		render.WatchSnapshot: {"type", "revision", "reset", "instances"},
		render.WatchPut:      {"type", "revision", "instance"},
		render.WatchDelete:   {"type", "revision", "service", "id"},
		render.WatchProgress: {"type", "revision"},
	}[l.Type]
	if want == nil {
		t.Fatalf("watch line %q: unknown type %q", raw, l.Type)
	}
	if l.NewEpoch {
		want = append(want, "new_epoch")
	}
	var got []string
	for k := range m {
		got = append(got, k)
	}
	slices.Sort(got)
	slices.Sort(want)
	if !slices.Equal(got, want) {
		t.Fatalf("watch line %q: keys %q, want %q", raw, got, want)
	}
	if l.Type == render.WatchSnapshot && string(m["instances"])[0] != '[' {
		t.Fatalf("watch line %q: instances is not an array", raw)
	}
	if l.Revision <= 0 {
		t.Fatalf("watch line %q: revision %d", raw, l.Revision)
	}
	return l
}

func wantPut(t *testing.T, l render.WatchLine, id, lifecycle string, rev int64) {
	t.Helper()
	if l.Type != render.WatchPut || l.Instance == nil || l.Instance.Service != "orders" || l.Instance.ID != id || l.Instance.Lifecycle != lifecycle {
		t.Fatalf("got %+v, want a put of orders/%s %s", l, id, lifecycle)
	}
	if l.Revision != rev || l.Instance.ModRevision != rev {
		t.Fatalf("put of orders/%s at revision %d (mod_revision %d), want %d", id, l.Revision, l.Instance.ModRevision, rev)
	}
}

func register(t *testing.T, api registryv1.RegistryClient, service, id, addr string) *registryv1.RegisterResponse {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	resp, err := api.Register(ctx, &registryv1.RegisterRequest{Instance: &registryv1.Instance{Service: service, Id: id, Address: addr}, Ttl: durationpb.New(time.Minute)})
	if err != nil {
		t.Fatalf("register %s/%s: %v", service, id, err)
	}
	return resp
}

func drain(t *testing.T, api registryv1.RegistryClient, service, id string) *registryv1.DrainResponse {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	resp, err := api.Drain(ctx, &registryv1.DrainRequest{Service: service, Id: id, Reason: "test"})
	if err != nil {
		t.Fatalf("drain %s/%s: %v", service, id, err)
	}
	return resp
}

func deregister(t *testing.T, api registryv1.RegistryClient, service, id string) *registryv1.DeregisterResponse {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	resp, err := api.Deregister(ctx, &registryv1.DeregisterRequest{Service: service, Id: id})
	if err != nil || !resp.Deleted {
		t.Fatalf("deregister %s/%s: %v (deleted %v)", service, id, err, resp.GetDeleted())
	}
	return resp
}

// TestWatchJSON follows one service through registrations, a drain and a
// deregistration, and checks the exact sequence of JSON lines.
func TestWatchJSON(t *testing.T) {
	rn := regnodetest.Start(t)
	api := apiClient(t, rn.Addr)
	w := &jsonWatch{watchProc: startWatch(t, "--endpoints", rn.Addr, "-o", "json", "watch", "orders")}

	snap := w.nextJSON(t)
	if snap.Type != render.WatchSnapshot || snap.Reset == nil || *snap.Reset || snap.NewEpoch || len(snap.Instances) != 0 {
		t.Fatalf("first line %+v, want a snapshot with reset false and no instances", snap)
	}

	r1 := register(t, api, "orders", "o-1", "10.0.0.1:80")
	wantPut(t, w.nextJSON(t), "o-1", "SERVING", r1.Revision)
	if l := w.all[len(w.all)-1]; l.Instance.Address != "10.0.0.1:80" || l.Instance.LeaseID != hex(r1.LeaseId) {
		t.Errorf("put of o-1 = %+v", l.Instance)
	}

	// Another service's change is not shown; the revision still moves
	// (progress lines are always printed in JSON).
	other := register(t, api, "web", "w-1", "10.0.0.9:80")

	r2 := register(t, api, "orders", "o-2", "10.0.0.2:80")
	wantPut(t, w.nextJSON(t), "o-2", "SERVING", r2.Revision)

	d1 := drain(t, api, "orders", "o-1")
	l := w.nextJSON(t)
	wantPut(t, l, "o-1", "DRAINING", d1.Revision)
	if l.Instance.LifecycleReason != "test" {
		t.Errorf("drained o-1 lifecycle_reason %q, want %q", l.Instance.LifecycleReason, "test")
	}

	x2 := deregister(t, api, "orders", "o-2")
	// The deregistration's DRAINING mark comes first (it tells it from
	// a lease expiry), then the delete.
	if l = w.nextJSON(t); l.Type != render.WatchPut || l.Instance.ID != "o-2" || l.Instance.Lifecycle != "DRAINING" || l.Revision >= x2.Revision {
		t.Fatalf("got %+v, want the DRAINING mark of orders/o-2 before revision %d", l, x2.Revision)
	}
	l = w.nextJSON(t)
	if l.Type != render.WatchDelete || l.Service != "orders" || l.ID != "o-2" || l.Revision != x2.Revision {
		t.Fatalf("got %+v, want a delete of orders/o-2 at revision %d", l, x2.Revision)
	}

	// A progress line at or past the other service's change, bounded by
	// the deadline of next.
	for w.progress == 0 || w.rev < other.Revision {
		if l := w.nextAny(t); l.Type != render.WatchProgress {
			t.Fatalf("unexpected line %+v", l)
		}
	}

	rest := w.stop(t, os.Interrupt)
	for _, raw := range rest {
		if l := checkWatchLine(t, raw); l.Type != render.WatchProgress {
			t.Errorf("after the changes, line %q", raw)
		}
	}
	var types []string
	for _, l := range w.all {
		if l.Type != render.WatchProgress {
			types = append(types, l.Type)
		}
		if l.Type == render.WatchPut && l.Instance.Service != "orders" {
			t.Errorf("watch orders showed %s/%s", l.Instance.Service, l.Instance.ID)
		}
	}
	if want := []string{"snapshot", "put", "put", "put", "put", "delete"}; !slices.Equal(types, want) {
		t.Errorf("line types %q, want %q", types, want)
	}
	if s := w.stderr.String(); s != "" {
		t.Errorf("stderr %q, want nothing", s)
	}
}

// TestWatchRideThrough follows two regnodes of one etcd, closes the one
// the watch is streaming from, and checks that later changes still arrive
// from the other, with revisions that never go down.
func TestWatchRideThrough(t *testing.T) {
	m := etcdtest.Start(t, false)
	rns := []*regnodetest.Regnode{regnodetest.StartExternal(t, m.ClientURL), regnodetest.StartExternal(t, m.ClientURL)}
	w := &jsonWatch{watchProc: startWatch(t, "--endpoints", rns[0].Addr+","+rns[1].Addr, "-o", "json", "watch")}

	if l := w.nextJSON(t); l.Type != render.WatchSnapshot || *l.Reset || len(l.Instances) != 0 {
		t.Fatalf("first line %+v, want an empty snapshot", l)
	}
	// Which regnode serves the stream? It has the one subscriber.
	serving := -1
	deadline := time.Now().Add(lineWait)
	for serving < 0 {
		for i, rn := range rns {
			if rn.Node.Hub().Subscribers() == 1 {
				serving = i
			}
		}
		if serving < 0 {
			if time.Now().After(deadline) {
				t.Fatal("no regnode has the watch's stream")
			}
			time.Sleep(20 * time.Millisecond)
		}
	}
	gone, survivor := rns[serving], rns[1-serving]
	api := apiClient(t, survivor.Addr)

	r1 := register(t, api, "orders", "o-1", "10.0.0.1:80")
	wantPut(t, w.nextJSON(t), "o-1", "SERVING", r1.Revision)

	if err := gone.Node.Close(); err != nil {
		t.Fatalf("close regnode: %v", err)
	}

	// The changes made after the close arrive, in order, through the
	// survivor. (A reset snapshot would be allowed by the contract, but the
	// survivor's ring holds every revision missed, so none is expected.)
	r2 := register(t, api, "orders", "o-2", "10.0.0.2:80")
	wantPut(t, w.nextJSON(t), "o-2", "SERVING", r2.Revision)
	d1 := drain(t, api, "orders", "o-1")
	wantPut(t, w.nextJSON(t), "o-1", "DRAINING", d1.Revision)
	x1 := deregister(t, api, "orders", "o-1")
	if l := w.nextJSON(t); l.Type != render.WatchDelete || l.Service != "orders" || l.ID != "o-1" || l.Revision != x1.Revision {
		t.Fatalf("got %+v, want a delete of orders/o-1 at revision %d", l, x1.Revision)
	}
	if n := survivor.Node.Hub().Subscribers(); n != 1 {
		t.Errorf("survivor has %d subscribers, want the watch's stream", n)
	}
	if w.snapshots != 1 {
		t.Errorf("%d snapshots, want only the first", w.snapshots)
	}
	w.stop(t, syscall.SIGTERM)
	if s := w.stderr.String(); s != "" {
		t.Errorf("stderr %q, want nothing", s)
	}
}

// TestWatchTable checks the table form: the first snapshot and its
// instances, then a line per change.
func TestWatchTable(t *testing.T) {
	rn := regnodetest.Start(t)
	api := apiClient(t, rn.Addr)
	r0 := register(t, api, "orders", "o-0", "10.0.0.10:80")
	rev := func(r int64) string { return "REV " + strconv.FormatInt(r, 10) + "  " }
	// The regnode's fan-out follows etcd a moment behind a write's answer:
	// the first snapshots below must be served from a view that has o-0.
	rn.WaitRevision(t, r0.Revision)

	t.Run("table", func(t *testing.T) {
		w := startWatch(t, "--endpoints", rn.Addr, "watch", "orders")
		first := w.next(t)
		if !strings.HasPrefix(first, "REV ") || !strings.HasSuffix(first, "  SNAPSHOT  1 instance") {
			t.Fatalf("first line %q, want REV R  SNAPSHOT  1 instance", first)
		}
		if l, want := w.next(t), "  SNAPSHOT  orders/o-0  10.0.0.10:80  SERVING  UNKNOWN"; !strings.HasSuffix(l, want) {
			t.Fatalf("second line %q, want ...%q", l, want)
		}
		r1 := register(t, api, "orders", "o-1", "10.0.0.1:80")
		if l, want := w.next(t), rev(r1.Revision)+"PUT  orders/o-1  10.0.0.1:80  SERVING  UNKNOWN"; l != want {
			t.Fatalf("line %q, want %q", l, want)
		}
		d1 := drain(t, api, "orders", "o-1")
		if l, want := w.next(t), rev(d1.Revision)+"PUT  orders/o-1  10.0.0.1:80  DRAINING  UNKNOWN"; l != want {
			t.Fatalf("line %q, want %q", l, want)
		}
		x1 := deregister(t, api, "orders", "o-1")
		if l, want := w.next(t), rev(x1.Revision)+"DELETE  orders/o-1"; l != want {
			t.Fatalf("line %q, want %q", l, want)
		}
		if rest := w.stop(t, os.Interrupt); len(rest) != 0 {
			t.Errorf("lines after the changes %q; want none (no progress without --progress)", rest)
		}
		if s := w.stderr.String(); s != "" {
			t.Errorf("stderr %q, want nothing", s)
		}
	})

	t.Run("wide with progress", func(t *testing.T) {
		w := startWatch(t, "--endpoints", rn.Addr, "-o", "wide", "watch", "orders", "--progress")
		if l := w.next(t); !strings.Contains(l, "  SNAPSHOT  1 instance") {
			t.Fatalf("first line %q", l)
		}
		l := w.next(t)
		for _, want := range []string{"SNAPSHOT  orders/o-0  10.0.0.10:80", "weight=100", "lease=" + hex(r0.LeaseId), "mod_rev=" + strconv.FormatInt(r0.Revision, 10)} {
			if !strings.Contains(l, want) {
				t.Errorf("wide snapshot line %q lacks %q", l, want)
			}
		}
		// The revision moves (another service, or etcd's progress
		// notifications): a PROGRESS line, bounded by next's deadline.
		other := register(t, api, "web", "w-1", "10.0.0.9:80")
		for {
			l := w.next(t)
			f := strings.Fields(l)
			if len(f) != 3 || f[0] != "REV" || f[2] != "PROGRESS" {
				t.Fatalf("line %q, want REV R  PROGRESS", l)
			}
			r, err := strconv.ParseInt(f[1], 10, 64)
			if err != nil {
				t.Fatalf("line %q: revision: %v", l, err)
			}
			if r >= other.Revision {
				break
			}
		}
		w.stop(t, os.Interrupt)
	})
}

// TestWatchWaits checks that watch outlives an unreachable regnode: one
// warning after --timeout, then it follows the regnode once it is up.
func TestWatchWaits(t *testing.T) {
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	addr := l.Addr().String()
	l.Close()

	w := startWatch(t, "--endpoints", addr, "--timeout", "1s", "-o", "json", "watch")
	deadline := time.Now().Add(lineWait)
	want := "regctl: warning: no regnode at " + addr + " answered within 1s (--timeout); still trying"
	for !strings.Contains(w.stderr.String(), want) {
		if time.Now().After(deadline) {
			t.Fatalf("stderr %q after %s, want %q", w.stderr.String(), lineWait, want)
		}
		time.Sleep(20 * time.Millisecond)
	}
	if s := w.stderr.String(); strings.Count(s, "\n") != 1 {
		t.Errorf("stderr %q, want one line", s)
	}

	m := etcdtest.Start(t, false)
	regnodetest.StartWith(t, node.Config{EtcdEndpoints: []string{m.ClientURL}, Listen: addr}, m.ClientURL)
	jw := &jsonWatch{watchProc: w}
	if l := jw.nextJSON(t); l.Type != render.WatchSnapshot || *l.Reset {
		t.Fatalf("first line %+v, want a snapshot", l)
	}
	w.stop(t, os.Interrupt)
	if s := w.stderr.String(); strings.Count(s, "\n") != 1 {
		t.Errorf("stderr %q, want only the warning", s)
	}
}

// TestWatchUsage checks that a bad command line exits 2 at once.
func TestWatchUsage(t *testing.T) {
	ctl := ctlOf(t, "127.0.0.1:1")
	for _, tc := range []struct {
		args []string
		want string
	}{
		{[]string{"watch", "Orders"}, "invalid service"},
		{[]string{"watch", "orders/o-1"}, "invalid service"},
		{[]string{"watch", "orders", "web"}, "at most one argument"},
		{[]string{"watch", "--bogus"}, "unknown flag: --bogus"},
		{[]string{"-o", "yaml", "watch"}, `invalid -o "yaml"`},
	} {
		r := ctl(tc.args...)
		mustFail(t, r, 2, tc.want)
		if !strings.Contains(r.stderr, "--help") {
			t.Errorf("usage error without a --help hint; %v", r)
		}
	}
}

// TestWatchPrinter feeds changes to the printer directly, for what a real
// regnode rarely does on demand: resets, a new epoch, a write error.
func TestWatchPrinter(t *testing.T) {
	inst := func(id string, rev int64, lc registryv1.Lifecycle) *registryv1.Instance {
		return &registryv1.Instance{Service: "orders", Id: id, Address: "10.0.0.1:80", Lifecycle: lc, ModRevision: rev}
	}
	serving, draining := registryv1.Lifecycle_LIFECYCLE_SERVING, registryv1.Lifecycle_LIFECYCLE_DRAINING
	a5, b5 := inst("a", 5, serving), inst("b", 5, serving)
	a7 := inst("a", 7, draining)
	c9 := inst("c", 9, serving)
	changes := []client.Change{
		{Diff: cache.Diff{Revision: 5, Reset: true, Added: []*registryv1.Instance{a5, b5}}, Snapshot: true, Instances: []*registryv1.Instance{b5, a5}},
		{Diff: cache.Diff{Revision: 6}, Progress: true},
		{Diff: cache.Diff{Revision: 7, Updated: []*registryv1.Instance{a7}, Removed: []cache.Key{{Service: "orders", ID: "b"}}}},
		{Diff: cache.Diff{Revision: 9, Reset: true, Added: []*registryv1.Instance{c9}}, Snapshot: true, Instances: []*registryv1.Instance{a7, c9}},
		{Diff: cache.Diff{Revision: 2, Reset: true, Removed: []cache.Key{{Service: "orders", ID: "a"}}}, Snapshot: true, NewEpoch: true, Instances: []*registryv1.Instance{c9}},
	}
	feed := func(output string, progress bool) (string, string) {
		var out, errb bytes.Buffer
		p := &watchPrinter{o: &options{output: output, stdout: &out}, stderr: &errb, progress: progress,
			failed: func(err error) { t.Errorf("write failed: %v", err) }}
		for _, ch := range changes {
			p.change(ch)
		}
		return out.String(), errb.String()
	}

	out, errs := feed(outTable, false)
	want := `REV 5  SNAPSHOT  2 instances
REV 5  SNAPSHOT  orders/a  10.0.0.1:80  SERVING  UNKNOWN
REV 5  SNAPSHOT  orders/b  10.0.0.1:80  SERVING  UNKNOWN
REV 7  PUT  orders/a  10.0.0.1:80  DRAINING  UNKNOWN
REV 7  DELETE  orders/b
REV 9  RESET  2 instances
REV 9  PUT  orders/c  10.0.0.1:80  SERVING  UNKNOWN
REV 2  RESET  *** NEW EPOCH: etcd was restored or replaced; revisions start over ***  1 instance
REV 2  DELETE  orders/a
`
	if out != want {
		t.Errorf("table:\n%s\nwant:\n%s", out, want)
	}
	if !strings.Contains(errs, "NEW EPOCH at revision 2") || strings.Count(errs, "\n") != 1 {
		t.Errorf("stderr %q, want one NEW EPOCH warning", errs)
	}
	if out, _ := feed(outTable, true); !strings.Contains(out, "\nREV 6  PROGRESS\n") {
		t.Errorf("table with --progress lacks the progress line:\n%s", out)
	}

	out, _ = feed(outJSON, false)
	var got []string
	for _, raw := range strings.Split(strings.TrimSuffix(out, "\n"), "\n") {
		l := checkWatchLine(t, raw)
		s := l.Type + " " + strconv.FormatInt(l.Revision, 10)
		switch l.Type {
		case render.WatchSnapshot:
			s += " reset=" + strconv.FormatBool(*l.Reset) + " new_epoch=" + strconv.FormatBool(l.NewEpoch)
			for _, in := range l.Instances {
				s += " " + in.ID
			}
		case render.WatchPut:
			s += " " + l.Instance.ID + " " + l.Instance.Lifecycle
		case render.WatchDelete:
			s += " " + l.Service + "/" + l.ID
		}
		got = append(got, s)
	}
	wantJSON := []string{
		"snapshot 5 reset=false new_epoch=false a b",
		"progress 6",
		"put 7 a DRAINING",
		"delete 7 orders/b",
		"snapshot 9 reset=true new_epoch=false a c",
		"snapshot 2 reset=true new_epoch=true c",
	}
	if !slices.Equal(got, wantJSON) {
		t.Errorf("json lines:\n%s\nwant:\n%s", strings.Join(got, "\n"), strings.Join(wantJSON, "\n"))
	}

	// A write error is reported once and stops the printing.
	var failures []error
	p := &watchPrinter{o: &options{output: outJSON, stdout: failWriter{}}, stderr: io.Discard,
		failed: func(err error) { failures = append(failures, err) }}
	for _, ch := range changes {
		p.change(ch)
	}
	if len(failures) != 1 || !strings.Contains(failures[0].Error(), "writing to stdout") {
		t.Errorf("failures %v, want one write error", failures)
	}
}

type failWriter struct{}

func (failWriter) Write([]byte) (int, error) { return 0, syscall.EPIPE }
