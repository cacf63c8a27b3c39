package httpapi_test

import (
	"bufio"
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"net/http/httptest"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus/testutil"
	clientv3 "go.etcd.io/etcd/client/v3"
	"go.uber.org/goleak"
	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials/insecure"
	"google.golang.org/protobuf/types/known/durationpb"

	"github.com/regcluster/registry/httpapi"
	"github.com/regcluster/registry/internal/chunk"
	"github.com/regcluster/registry/internal/etcdtest"
	"github.com/regcluster/registry/internal/regnodetest"
	"github.com/regcluster/registry/internal/render"
	registryv1 "github.com/regcluster/registry/proto/registry/v1"
	"github.com/regcluster/registry/record"
)

func TestMain(m *testing.M) {
	goleak.VerifyTestMain(m, append(etcdtest.LeakOptions(),
		goleak.IgnoreAnyFunction("net/http.(*persistConn).readLoop"),
		goleak.IgnoreAnyFunction("net/http.(*persistConn).writeLoop"),
		goleak.IgnoreAnyFunction("net/http.(*connReader).backgroundRead"),
		goleak.IgnoreAnyFunction("net/http.(*conn).serve"),
	)...)
}

// fixture is a real regnode on embedded etcd, a gRPC client of it, and the
// base URL of its HTTP port.
type fixture struct {
	rn   *regnodetest.Regnode
	rpc  registryv1.RegistryClient
	base string
	http *http.Client
}

func start(t *testing.T) *fixture {
	t.Helper()
	rn := regnodetest.Start(t)
	cc, err := grpc.NewClient(rn.Addr, grpc.WithTransportCredentials(insecure.NewCredentials()))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { cc.Close() })
	hc := &http.Client{Transport: &http.Transport{}}
	t.Cleanup(hc.CloseIdleConnections)
	return &fixture{rn: rn, rpc: registryv1.NewRegistryClient(cc), base: "http://" + rn.Node.MetricsAddr(), http: hc}
}

func (f *fixture) register(t *testing.T, service, id, addr string) *registryv1.RegisterResponse {
	t.Helper()
	// An hour's lease: nothing keeps it alive during the test.
	resp, err := f.rpc.Register(context.Background(), &registryv1.RegisterRequest{Ttl: durationpb.New(time.Hour), Instance: &registryv1.Instance{
		Service: service, Id: id, Address: addr, Zone: "z1", Version: "v1.2", Metadata: map[string]string{"k": "v"}}})
	if err != nil {
		t.Fatalf("register %s/%s: %v", service, id, err)
	}
	return resp
}

// do sends a request and returns the status and body.
func (f *fixture) do(t *testing.T, method, path, body string, hdr ...string) (int, []byte, http.Header) {
	t.Helper()
	var rd io.Reader
	if body != "" {
		rd = strings.NewReader(body)
	}
	req, err := http.NewRequest(method, f.base+path, rd)
	if err != nil {
		t.Fatal(err)
	}
	for i := 0; i+1 < len(hdr); i += 2 {
		req.Header.Set(hdr[i], hdr[i+1])
	}
	resp, err := f.http.Do(req)
	if err != nil {
		t.Fatalf("%s %s: %v", method, path, err)
	}
	defer resp.Body.Close()
	b, err := io.ReadAll(resp.Body)
	if err != nil {
		t.Fatal(err)
	}
	return resp.StatusCode, b, resp.Header
}

// jsonOf is v as regctl prints it (-o json), compacted.
func jsonOf(t *testing.T, v any) string {
	t.Helper()
	var b bytes.Buffer
	enc := json.NewEncoder(&b)
	enc.SetEscapeHTML(false)
	if err := enc.Encode(v); err != nil {
		t.Fatal(err)
	}
	return b.String()
}

// Every read route answers exactly what regctl -o json prints for the same
// gRPC answer: the same types, the same field names.
func TestReadsAreTheCLIJSON(t *testing.T) {
	f := start(t)
	f.register(t, "orders", "o-2", "127.0.0.1:9002")
	reg := f.register(t, "orders", "o-1", "127.0.0.1:9001")
	f.register(t, "billing", "b-1", "127.0.0.1:9101")
	ctx := context.Background()

	all, err := f.rpc.List(ctx, &registryv1.ListRequest{})
	if err != nil {
		t.Fatal(err)
	}
	orders, err := f.rpc.List(ctx, &registryv1.ListRequest{Service: "orders"})
	if err != nil {
		t.Fatal(err)
	}
	one, err := f.rpc.Get(ctx, &registryv1.GetRequest{Service: "orders", Id: "o-1"})
	if err != nil {
		t.Fatal(err)
	}
	for _, c := range []struct {
		path string
		want any
	}{
		{"/api/v1/instances", render.NewInstances(all.Instances)},
		{"/api/v1/services/orders/instances", render.NewInstances(orders.Instances)},
		{"/api/v1/services/orders/instances/o-1", render.NewInstance(one.Instance)},
		{"/api/v1/services", render.CountServices(all.Instances)},
	} {
		code, body, hdr := f.do(t, "GET", c.path, "")
		if code != http.StatusOK || hdr.Get("Content-Type") != "application/json" {
			t.Fatalf("GET %s = %d %s: %s", c.path, code, hdr.Get("Content-Type"), body)
		}
		if got, want := string(body), jsonOf(t, c.want); got != want {
			t.Errorf("GET %s =\n%s\nwant (regctl -o json)\n%s", c.path, got, want)
		}
	}

	// The names docs/architecture.md promises, in the raw JSON: snake_case, enums
	// without prefix, the lease id in hex.
	_, body, _ := f.do(t, "GET", "/api/v1/services/orders/instances/o-1", "")
	var raw map[string]any
	if err := json.Unmarshal(body, &raw); err != nil {
		t.Fatal(err)
	}
	if raw["lease_id"] != strconv.FormatUint(uint64(reg.LeaseId), 16) || raw["lifecycle"] != "SERVING" ||
		raw["health"].(map[string]any)["state"] != "UNKNOWN" || raw["mod_revision"] == nil || raw["zone"] != "z1" {
		t.Errorf("get JSON = %s", body)
	}

	code, body, _ := f.do(t, "GET", "/api/v1/status", "")
	var st render.Status
	if err := json.Unmarshal(body, &st); code != http.StatusOK || err != nil {
		t.Fatalf("status = %d %s (%v)", code, body, err)
	}
	if st.Node != f.rn.Node.Name() || len(st.Members) != 1 || st.Revision < all.Revision || st.Counts.Total != 3 || st.Counts.Services != 2 {
		t.Errorf("status = %+v", st)
	}
	if !strings.Contains(string(body), `"compact_revision":`) || !strings.Contains(string(body), `"is_leader":true`) {
		t.Errorf("status JSON lacks the CLI's names: %s", body)
	}
}

type apiErr struct {
	Error string `json:"error"`
	Code  string `json:"code"`
	Field string `json:"field"`
}

// Bad input is a 400 whose JSON names the field, and writes nothing.
func TestBadInputNamesTheField(t *testing.T) {
	f := start(t)
	f.register(t, "orders", "o-1", "127.0.0.1:9001")
	// What the registry holds (the records and their saved states, with
	// their revisions): the regnode's own keys (its election session, the
	// epoch) may be written meanwhile and are not the requests' doing.
	rev := func() string {
		var out []string
		for _, prefix := range []string{f.rn.Prefix + "instances/", f.rn.Prefix + "state/"} {
			r, err := f.rn.Etcd.Get(context.Background(), prefix, clientv3.WithPrefix())
			if err != nil {
				t.Fatal(err)
			}
			for _, kv := range r.Kvs {
				out = append(out, fmt.Sprintf("%s@%d", kv.Key, kv.ModRevision))
			}
		}
		return strings.Join(out, " ")
	}
	before := rev()
	if !strings.Contains(before, "o-1@") {
		t.Fatalf("etcd holds %q under the registry's prefixes, want o-1's record", before)
	}
	for _, c := range []struct {
		method, path, body string
		code               int
		field              string
	}{
		{"GET", "/api/v1/services/Bad_Name/instances", "", 400, "service"},
		{"GET", "/api/v1/services/orders/instances/bad%20id", "", 400, "id"},
		{"GET", "/api/v1/instances?servce=orders", "", 400, "servce"},
		{"GET", "/api/v1/watch?from_revision=ten", "", 400, "from_revision"},
		{"GET", "/api/v1/watch?from_revision=-1", "", 400, "from_revision"},
		{"GET", "/api/v1/watch?service=NO", "", 400, "service"},
		{"POST", "/api/v1/services/orders/instances/o-1/drain", `{"reson":"x"}`, 400, "reson"},
		{"POST", "/api/v1/services/orders/instances/o-1/drain", `{"reason":5}`, 400, "reason"},
		{"POST", "/api/v1/services/orders/instances/o-1/drain", `{"reason":"x"} {}`, 400, "body"},
		{"POST", "/api/v1/services/orders/instances/o-1/drain", `[`, 400, "body"},
		{"POST", "/api/v1/services/orders/instances/o-1/undrain?now=1", ``, 400, "now"},
		{"POST", "/api/v1/services/or%2Fders/instances/o-1/drain", ``, 400, "service"},
		{"GET", "/api/v1/services/orders/instances/o-9", "", 404, ""},
		{"POST", "/api/v1/services/orders/instances/o-9/drain", "", 404, ""},
		{"GET", "/api/v1/nothing", "", 404, ""},
	} {
		code, body, _ := f.do(t, c.method, c.path, c.body)
		var e apiErr
		if err := json.Unmarshal(body, &e); err != nil || code != c.code || e.Field != c.field || e.Error == "" {
			t.Errorf("%s %s %s = %d %s, want %d naming %q", c.method, c.path, c.body, code, body, c.code, c.field)
		}
		if c.code == 400 && e.Code != "InvalidArgument" {
			t.Errorf("%s %s: code %q, want InvalidArgument", c.method, c.path, e.Code)
		}
	}
	if after := rev(); after != before {
		t.Errorf("bad requests wrote to etcd: %s, then %s", before, after)
	}
}

// instanceInEtcd reads the record straight from etcd.
func instanceInEtcd(t *testing.T, rn *regnodetest.Regnode, service, id string) *registryv1.Instance {
	t.Helper()
	keys := record.NewKeys(rn.Prefix)
	r, err := rn.Etcd.Get(context.Background(), keys.Instance(service, id))
	if err != nil || len(r.Kvs) != 1 {
		t.Fatalf("read %s/%s from etcd: %v (%d keys)", service, id, err, len(r.Kvs))
	}
	inst, err := keys.Decode(string(r.Kvs[0].Key), r.Kvs[0].Value, r.Kvs[0].CreateRevision, r.Kvs[0].ModRevision)
	if err != nil {
		t.Fatal(err)
	}
	return inst
}

// Drain and undrain over HTTP change the record in etcd; a cross-site
// browser request is refused and changes nothing.
func TestDrainUndrain(t *testing.T) {
	f := start(t)
	f.register(t, "orders", "o-1", "127.0.0.1:9001")

	code, body, _ := f.do(t, "POST", "/api/v1/services/orders/instances/o-1/drain", `{"reason":"kernel"}`,
		"Origin", "https://evil.example", "Sec-Fetch-Site", "cross-site")
	if code != http.StatusForbidden {
		t.Fatalf("cross-site drain = %d %s, want 403", code, body)
	}
	if lc := instanceInEtcd(t, f.rn, "orders", "o-1").Lifecycle; lc != registryv1.Lifecycle_LIFECYCLE_SERVING {
		t.Fatalf("after a refused cross-site drain the record is %v", lc)
	}

	code, body, hdr := f.do(t, "POST", "/api/v1/services/orders/instances/o-1/drain", `{"reason":"kernel"}`)
	var v render.Instance
	if err := json.Unmarshal(body, &v); code != 200 || err != nil || v.Lifecycle != "DRAINING" {
		t.Fatalf("drain = %d %s", code, body)
	}
	inst := instanceInEtcd(t, f.rn, "orders", "o-1")
	if inst.Lifecycle != registryv1.Lifecycle_LIFECYCLE_DRAINING || inst.LifecycleReason != "kernel" ||
		strconv.FormatInt(inst.ModRevision, 10) != hdr.Get("X-Registry-Revision") {
		t.Fatalf("after drain etcd has %v %q at %d (header %s)", inst.Lifecycle, inst.LifecycleReason, inst.ModRevision, hdr.Get("X-Registry-Revision"))
	}

	if code, body, _ := f.do(t, "POST", "/api/v1/services/orders/instances/o-1/undrain", ""); code != 200 {
		t.Fatalf("undrain = %d %s", code, body)
	}
	if lc := instanceInEtcd(t, f.rn, "orders", "o-1").Lifecycle; lc != registryv1.Lifecycle_LIFECYCLE_SERVING {
		t.Fatalf("after undrain etcd has %v", lc)
	}
}

// A read-only API refuses writes with 403 and writes nothing; reads work.
func TestReadOnly(t *testing.T) {
	f := start(t)
	f.register(t, "orders", "o-1", "127.0.0.1:9001")
	cc, err := grpc.NewClient(f.rn.Addr, grpc.WithTransportCredentials(insecure.NewCredentials()))
	if err != nil {
		t.Fatal(err)
	}
	defer cc.Close()
	api, err := httpapi.New(httpapi.Config{Conn: cc, ReadOnly: true})
	if err != nil {
		t.Fatal(err)
	}
	srv := httptest.NewServer(api)
	defer srv.Close()
	f.base = srv.URL
	for _, p := range []string{"drain", "undrain"} {
		code, body, _ := f.do(t, "POST", "/api/v1/services/orders/instances/o-1/"+p, "")
		var e apiErr
		if err := json.Unmarshal(body, &e); code != 403 || err != nil || e.Code != "PermissionDenied" {
			t.Errorf("read-only %s = %d %s", p, code, body)
		}
	}
	if lc := instanceInEtcd(t, f.rn, "orders", "o-1").Lifecycle; lc != registryv1.Lifecycle_LIFECYCLE_SERVING {
		t.Fatalf("a read-only drain changed the record to %v", lc)
	}
	if code, body, _ := f.do(t, "GET", "/api/v1/services/orders/instances/o-1", ""); code != 200 {
		t.Errorf("read-only get = %d %s", code, body)
	}
	f.http.CloseIdleConnections()
}

// sse reads Server-Sent Events: each event's data (one watch line) and
// the id it carries, if any.
type sse struct {
	t  *testing.T
	rd *bufio.Reader
}

type event struct {
	line render.WatchLine
	id   string
}

func (s *sse) next() event {
	s.t.Helper()
	var ev event
	var data string
	for {
		l, err := s.rd.ReadString('\n')
		if err != nil {
			s.t.Fatalf("read SSE: %v", err)
		}
		l = strings.TrimSuffix(l, "\n")
		switch {
		case l == "" && data != "":
			if err := json.Unmarshal([]byte(data), &ev.line); err != nil {
				s.t.Fatalf("SSE data %q: %v", data, err)
			}
			return ev
		case strings.HasPrefix(l, "data: "):
			data = strings.TrimPrefix(l, "data: ")
		case strings.HasPrefix(l, "id: "):
			ev.id = strings.TrimPrefix(l, "id: ")
		}
	}
}

// nextChange skips progress events.
func (s *sse) nextChange() event {
	s.t.Helper()
	for {
		if ev := s.next(); ev.line.Type != render.WatchProgress {
			return ev
		}
	}
}

func (f *fixture) watch(t *testing.T, ctx context.Context, path string, hdr ...string) (*sse, *http.Response) {
	t.Helper()
	req, err := http.NewRequestWithContext(ctx, "GET", f.base+path, nil)
	if err != nil {
		t.Fatal(err)
	}
	for i := 0; i+1 < len(hdr); i += 2 {
		req.Header.Set(hdr[i], hdr[i+1])
	}
	resp, err := f.http.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	if resp.StatusCode != 200 || resp.Header.Get("Content-Type") != "text/event-stream" {
		b, _ := io.ReadAll(resp.Body)
		resp.Body.Close()
		t.Fatalf("watch %s = %d %s", path, resp.StatusCode, b)
	}
	return &sse{t: t, rd: bufio.NewReader(resp.Body)}, resp
}

// Watch over SSE: a snapshot, then puts and deletes with their revision as
// the event id, served by the regnode's fan-out (one more subscriber of
// the hub while the stream is open, none after); a reconnect with
// Last-Event-ID resumes after it.
func TestWatchSSE(t *testing.T) {
	f := start(t)
	f.register(t, "orders", "o-1", "127.0.0.1:9001")
	f.caughtUp(t, f.register(t, "billing", "b-1", "127.0.0.1:9101").Revision)
	subs := f.rn.Node.Metrics().Subscribers

	ctx, cancel := context.WithCancel(context.Background())
	s, resp := f.watch(t, ctx, "/api/v1/watch?service=orders")
	first := s.next()
	if first.line.Type != render.WatchSnapshot || *first.line.Reset || len(first.line.Instances) != 1 ||
		first.line.Instances[0].ID != "o-1" || first.id != strconv.FormatInt(first.line.Revision, 10) {
		t.Fatalf("first event = %+v", first)
	}
	if n := testutil.ToFloat64(subs); n != 1 {
		t.Errorf("subscribers of the fan-out while one SSE watch is open = %v, want 1", n)
	}

	reg := f.register(t, "orders", "o-2", "127.0.0.1:9002")
	put := s.nextChange()
	if put.line.Type != render.WatchPut || put.line.Instance.ID != "o-2" || put.line.Revision != reg.Revision || put.id != strconv.FormatInt(reg.Revision, 10) {
		t.Fatalf("after a registration: %+v, want put o-2 at %d", put, reg.Revision)
	}
	dr, err := f.rpc.Deregister(context.Background(), &registryv1.DeregisterRequest{Service: "orders", Id: "o-1"})
	if err != nil {
		t.Fatal(err)
	}
	// A deregistration leaves its mark first (the record DRAINING), so
	// a subscriber tells it from a lease expiry, then deletes.
	mark := s.nextChange()
	if mark.line.Type != render.WatchPut || mark.line.Instance.ID != "o-1" || mark.line.Instance.Lifecycle != "DRAINING" || mark.line.Revision >= dr.Revision {
		t.Fatalf("after a deregistration: %+v, want the DRAINING mark before the delete at %d", mark, dr.Revision)
	}
	del := s.nextChange()
	if del.line.Type != render.WatchDelete || del.line.ID != "o-1" || del.line.Service != "orders" || del.line.Revision != dr.Revision {
		t.Fatalf("after a deregistration: %+v", del)
	}
	cancel()
	resp.Body.Close()
	waitFor(t, "the closed SSE watch to leave the fan-out", func() bool { return testutil.ToFloat64(subs) == 0 })

	// A reconnect from the first snapshot's id gets what it missed, not a
	// snapshot.
	ctx2, cancel2 := context.WithCancel(context.Background())
	defer cancel2()
	s2, resp2 := f.watch(t, ctx2, "/api/v1/watch?service=orders", "Last-Event-ID", first.id)
	defer resp2.Body.Close()
	if ev := s2.nextChange(); ev.line.Type != render.WatchPut || ev.line.Instance.ID != "o-2" {
		t.Fatalf("resumed from %s: %+v, want the put of o-2", first.id, ev)
	}
	if ev := s2.nextChange(); ev.line.Type != render.WatchPut || ev.line.Instance.ID != "o-1" || ev.line.Instance.Lifecycle != "DRAINING" {
		t.Fatalf("resumed from %s: %+v, want the DRAINING mark of o-1", first.id, ev)
	}
	if ev := s2.nextChange(); ev.line.Type != render.WatchDelete || ev.line.ID != "o-1" {
		t.Fatalf("resumed from %s: %+v, want the delete of o-1", first.id, ev)
	}
}

// caughtUp waits until the regnode's fan-out has applied rev, so that a
// new watch's snapshot holds everything written up to it (a watch is served
// from the fan-out, which follows etcd a little behind).
func (f *fixture) caughtUp(t *testing.T, rev int64) {
	t.Helper()
	f.rn.WaitRevision(t, rev)
}

func waitFor(t *testing.T, what string, cond func() bool) {
	t.Helper()
	deadline := time.Now().Add(10 * time.Second)
	for !cond() {
		if time.Now().After(deadline) {
			t.Fatalf("timed out waiting for %s", what)
		}
		time.Sleep(10 * time.Millisecond)
	}
}

// A snapshot larger than one Watch chunk (chunk.MaxBytes) is one SSE
// event, as regctl watch prints it.
func TestWatchSSEJoinsAChunkedSnapshot(t *testing.T) {
	f := start(t)
	keys := record.NewKeys(f.rn.Prefix)
	// About 13 KiB each: 100 of them are more than one chunk.
	meta := map[string]string{}
	for k := range 13 {
		meta[fmt.Sprintf("k%02d", k)] = strings.Repeat("v", 1000)
	}
	n := chunk.MaxBytes/(13*1000) + 20
	for i := range n {
		inst := &registryv1.Instance{Service: "bulk", Id: fmt.Sprintf("b-%04d", i), Address: "127.0.0.1:9000",
			Lifecycle: registryv1.Lifecycle_LIFECYCLE_SERVING, Metadata: meta}
		v, err := record.Encode(inst)
		if err != nil {
			t.Fatal(err)
		}
		if _, err := f.rn.Etcd.Put(context.Background(), keys.Instance("bulk", inst.Id), string(v)); err != nil {
			t.Fatal(err)
		}
	}
	r, err := f.rn.Etcd.Get(context.Background(), "any")
	if err != nil {
		t.Fatal(err)
	}
	last := r.Header.Revision
	f.caughtUp(t, last)
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	s, resp := f.watch(t, ctx, "/api/v1/watch?service=bulk&from_revision=0")
	defer resp.Body.Close()
	ev := s.next()
	if ev.line.Type != render.WatchSnapshot || len(ev.line.Instances) != n || ev.line.Revision < last {
		t.Fatalf("first event: %s with %d instances at %d, want one snapshot of %d at >= %d", ev.line.Type, len(ev.line.Instances), ev.line.Revision, n, last)
	}
}

// Closing the regnode ends an open SSE watch (the stream reaches its end)
// and Close reports no error: the watch does not hold the HTTP server's
// shutdown until its grace runs out.
func TestCloseEndsSSEWatch(t *testing.T) {
	f := start(t)
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	s, resp := f.watch(t, ctx, "/api/v1/watch")
	defer resp.Body.Close()
	if ev := s.next(); ev.line.Type != render.WatchSnapshot {
		t.Fatalf("first event = %+v", ev)
	}
	if err := f.rn.Node.Close(); err != nil {
		t.Fatalf("close with an SSE watch open: %v", err)
	}
	for {
		if _, err := s.rd.ReadString('\n'); err != nil {
			if err != io.EOF {
				t.Fatalf("the SSE watch ended with %v, want its end (EOF)", err)
			}
			return
		}
	}
}
