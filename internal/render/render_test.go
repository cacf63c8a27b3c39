package render

import (
	"bytes"
	"encoding/json"
	"reflect"
	"sort"
	"strings"
	"testing"
	"time"

	"google.golang.org/protobuf/types/known/durationpb"
	"google.golang.org/protobuf/types/known/timestamppb"

	registryv1 "github.com/regcluster/registry/proto/registry/v1"
)

var (
	since      = time.Date(2026, 3, 4, 5, 6, 7, 891011121, time.FixedZone("CET", 3600))
	registered = time.Date(2026, 3, 4, 4, 0, 0, 5, time.UTC)
)

func fullInstance() *registryv1.Instance {
	return &registryv1.Instance{
		Service: "orders", Id: "o-1", Address: "10.0.0.7:8080", Zone: "eu-1a", Version: "1.2.3",
		Weight: 50, Metadata: map[string]string{"az": "eu-1a", "tier": "gold"},
		Check: &registryv1.HealthCheck{
			Kind: registryv1.CheckKind_CHECK_KIND_HTTP, Target: "/healthz",
			Interval: durationpb.New(time.Second), Timeout: durationpb.New(500 * time.Millisecond),
			FailuresToDegraded: 3,
		},
		Lifecycle:       registryv1.Lifecycle_LIFECYCLE_DRAINING,
		LifecycleReason: "kernel upgrade",
		Health: &registryv1.Health{
			State: registryv1.HealthState_HEALTH_STATE_DEGRADED, Since: timestamppb.New(since),
			Reason: "3 slow probes", LastLatency: durationpb.New(1500 * time.Microsecond),
			Observer: "regnode-2", Fence: 42,
		},
		LeaseId:        0x694d8a3c1f2b0e07,
		RegisteredAt:   timestamppb.New(registered),
		Incarnation:    "abc",
		ModRevision:    17,
		CreateRevision: 11,
	}
}

// decode marshals v and decodes it into a generic map, to see exactly what
// a script sees.
func decode(t *testing.T, v any) map[string]any {
	t.Helper()
	b, err := json.Marshal(v)
	if err != nil {
		t.Fatal(err)
	}
	var m map[string]any
	if err := json.Unmarshal(b, &m); err != nil {
		t.Fatalf("%s: %v", b, err)
	}
	return m
}

func keys(m map[string]any) []string {
	var ks []string
	for k := range m {
		ks = append(ks, k)
	}
	sort.Strings(ks)
	return ks
}

func wantKeys(t *testing.T, what string, m map[string]any, want ...string) {
	t.Helper()
	sort.Strings(want)
	if got := keys(m); !reflect.DeepEqual(got, want) {
		t.Errorf("%s keys = %v, want %v", what, got, want)
	}
}

func TestInstanceJSON(t *testing.T) {
	m := decode(t, NewInstance(fullInstance()))
	wantKeys(t, "instance", m, "service", "id", "address", "zone", "version", "weight", "metadata",
		"lifecycle", "lifecycle_reason", "health", "check", "lease_id", "mod_revision",
		"create_revision", "registered_at", "incarnation")
	h := m["health"].(map[string]any)
	wantKeys(t, "health", h, "state", "since", "reason", "observer", "fence", "latency_ms")
	c := m["check"].(map[string]any)
	wantKeys(t, "check", c, "kind", "target", "interval", "timeout", "failures_to_degraded")

	for k, want := range map[string]any{
		"service": "orders", "id": "o-1", "address": "10.0.0.7:8080", "zone": "eu-1a",
		"version": "1.2.3", "weight": 50.0, "lifecycle": "DRAINING", "lifecycle_reason": "kernel upgrade",
		"lease_id": "694d8a3c1f2b0e07", "mod_revision": 17.0, "create_revision": 11.0,
		"registered_at": "2026-03-04T04:00:00.000000005Z", "incarnation": "abc",
	} {
		if m[k] != want {
			t.Errorf("%s = %#v, want %#v", k, m[k], want)
		}
	}
	if md := m["metadata"].(map[string]any); md["az"] != "eu-1a" || md["tier"] != "gold" || len(md) != 2 {
		t.Errorf("metadata = %v", md)
	}
	for k, want := range map[string]any{
		"state": "DEGRADED", "since": "2026-03-04T04:06:07.891011121Z", "reason": "3 slow probes",
		"observer": "regnode-2", "fence": 42.0, "latency_ms": 1.5,
	} {
		if h[k] != want {
			t.Errorf("health.%s = %#v, want %#v", k, h[k], want)
		}
	}
	for k, want := range map[string]any{
		"kind": "HTTP", "target": "/healthz", "interval": "1s", "timeout": "500ms", "failures_to_degraded": 3.0,
	} {
		if c[k] != want {
			t.Errorf("check.%s = %#v, want %#v", k, c[k], want)
		}
	}
}

func TestInstanceJSONRoundTrip(t *testing.T) {
	v := NewInstance(fullInstance())
	b, err := json.Marshal(v)
	if err != nil {
		t.Fatal(err)
	}
	var back Instance
	if err := json.Unmarshal(b, &back); err != nil {
		t.Fatal(err)
	}
	if !reflect.DeepEqual(back, v) {
		t.Errorf("round trip:\n got %+v\nwant %+v", back, v)
	}
}

func TestInstanceJSONMinimal(t *testing.T) {
	m := decode(t, NewInstance(&registryv1.Instance{Service: "a", Id: "b", Address: "h:1"}))
	wantKeys(t, "instance", m, "service", "id", "address", "zone", "version", "weight", "metadata",
		"lifecycle", "lifecycle_reason", "health", "check", "lease_id", "mod_revision", "create_revision")
	if md, ok := m["metadata"].(map[string]any); !ok || len(md) != 0 {
		t.Errorf("metadata = %#v, want {}", m["metadata"])
	}
	h := m["health"].(map[string]any)
	wantKeys(t, "health", h, "state", "reason", "observer", "fence", "latency_ms")
	if h["state"] != "UNKNOWN" {
		t.Errorf("health.state = %v, want UNKNOWN", h["state"])
	}
	if c := m["check"].(map[string]any); c["kind"] != "NONE" || len(c) != 1 {
		t.Errorf("check = %v, want {kind: NONE}", c)
	}
	if m["lifecycle"] != "UNSPECIFIED" || m["lease_id"] != "0" {
		t.Errorf("lifecycle, lease_id = %v, %v", m["lifecycle"], m["lease_id"])
	}
}

func TestEnumNames(t *testing.T) {
	for _, tc := range []struct{ got, want string }{
		{Lifecycle(registryv1.Lifecycle_LIFECYCLE_UNSPECIFIED), "UNSPECIFIED"},
		{Lifecycle(registryv1.Lifecycle_LIFECYCLE_STARTING), "STARTING"},
		{Lifecycle(registryv1.Lifecycle_LIFECYCLE_SERVING), "SERVING"},
		{Lifecycle(registryv1.Lifecycle_LIFECYCLE_DRAINING), "DRAINING"},
		{Lifecycle(registryv1.Lifecycle(99)), "99"},
		{HealthState(registryv1.HealthState_HEALTH_STATE_UNKNOWN), "UNKNOWN"},
		{HealthState(registryv1.HealthState_HEALTH_STATE_HEALTHY), "HEALTHY"},
		{HealthState(registryv1.HealthState_HEALTH_STATE_DEGRADED), "DEGRADED"},
		{HealthState(registryv1.HealthState_HEALTH_STATE_UNAVAILABLE), "UNAVAILABLE"},
		{CheckKind(registryv1.CheckKind_CHECK_KIND_NONE), "NONE"},
		{CheckKind(registryv1.CheckKind_CHECK_KIND_TCP), "TCP"},
		{CheckKind(registryv1.CheckKind_CHECK_KIND_HTTP), "HTTP"},
		{CheckKind(registryv1.CheckKind_CHECK_KIND_GRPC), "GRPC"},
	} {
		if tc.got != tc.want {
			t.Errorf("got %q, want %q", tc.got, tc.want)
		}
	}
}

func TestNewInstancesEmptyAndSorted(t *testing.T) {
	b, err := json.Marshal(NewInstances(nil))
	if err != nil {
		t.Fatal(err)
	}
	if string(b) != "[]" {
		t.Errorf("no instances = %s, want []", b)
	}
	got := NewInstances([]*registryv1.Instance{
		{Service: "orders", Id: "b"}, {Service: "billing", Id: "z"}, {Service: "orders", Id: "a"},
	})
	var names []string
	for _, i := range got {
		names = append(names, i.Service+"/"+i.ID)
	}
	if want := []string{"billing/z", "orders/a", "orders/b"}; !reflect.DeepEqual(names, want) {
		t.Errorf("order = %v, want %v", names, want)
	}
}

func TestCountServices(t *testing.T) {
	h := func(s registryv1.HealthState) *registryv1.Health { return &registryv1.Health{State: s} }
	got := CountServices([]*registryv1.Instance{
		{Service: "orders", Lifecycle: registryv1.Lifecycle_LIFECYCLE_SERVING, Health: h(registryv1.HealthState_HEALTH_STATE_HEALTHY)},
		{Service: "orders", Lifecycle: registryv1.Lifecycle_LIFECYCLE_DRAINING, Health: h(registryv1.HealthState_HEALTH_STATE_DEGRADED)},
		{Service: "orders", Lifecycle: registryv1.Lifecycle_LIFECYCLE_STARTING, Health: h(registryv1.HealthState_HEALTH_STATE_UNAVAILABLE)},
		{Service: "billing"},
	})
	want := []ServiceCounts{
		{Service: "billing", Total: 1, Serving: 1, Unknown: 1},
		{Service: "orders", Total: 3, Starting: 1, Serving: 1, Draining: 1, Healthy: 1, Degraded: 1, Unavailable: 1},
	}
	if !reflect.DeepEqual(got, want) {
		t.Errorf("got %+v\nwant %+v", got, want)
	}
	wantKeys(t, "service counts", decode(t, got[0]), "service", "total", "starting", "serving",
		"draining", "healthy", "degraded", "unavailable", "unknown")
	if b, err := json.Marshal(CountServices(nil)); err != nil || string(b) != "[]" {
		t.Errorf("no services = %s (%v), want []", b, err)
	}
}

func TestStatusJSON(t *testing.T) {
	m := decode(t, NewStatus(&registryv1.StatusResponse{
		Node: "rn-1", Leader: "rn-2", Revision: 99, CompactRevision: 50, ClusterId: 0xcdf818194e3a8c32,
		Members: []*registryv1.Member{{Id: 0x8e9e05c52164694d, Name: "m1", PeerUrls: []string{"http://p"},
			ClientUrls: []string{"http://c"}, IsLeader: true}},
		Counts:      &registryv1.InstanceCounts{Total: 3, Serving: 2, Draining: 1, Unknown: 3, Services: 2},
		JunkSkipped: 1, Embedded: true, EtcdVersion: "3.7.3", Version: "0.1.0", Epoch: "5f1e",
		Probing: &registryv1.Probing{Node: "rn-1", Owned: 9},
		Regnodes: []*registryv1.Probing{{Node: "rn-1", Address: "10.0.0.1:7400", Zone: "z1", Owned: 9, Probes: 90, ProbesPerSecond: 9.5,
			Disagreements: 2, Held: 1, Canary: "etcd slow", Members: 2}, {Node: "rn-2", Address: "10.0.0.2:7400", Error: "unreachable"}},
	}))
	wantKeys(t, "status", m, "node", "leader", "revision", "compact_revision", "members", "cluster_id", "epoch",
		"counts", "junk_skipped", "embedded", "etcd_version", "version", "probing")
	probing := m["probing"].([]any)
	if len(probing) != 2 {
		t.Fatalf("probing = %v, want both regnodes'", probing)
	}
	p0 := probing[0].(map[string]any)
	wantKeys(t, "probing", p0, "node", "address", "zone", "owned", "probes", "probes_per_second", "disagreements", "held", "canary", "members")
	if p0["owned"] != 9.0 || p0["disagreements"] != 2.0 || p0["canary"] != "etcd slow" || probing[1].(map[string]any)["error"] != "unreachable" {
		t.Errorf("probing = %v", probing)
	}
	for k, want := range map[string]any{
		"node": "rn-1", "leader": "rn-2", "revision": 99.0, "compact_revision": 50.0,
		"cluster_id": "cdf818194e3a8c32", "epoch": "5f1e", "junk_skipped": 1.0, "embedded": true, "etcd_version": "3.7.3",
	} {
		if m[k] != want {
			t.Errorf("%s = %#v, want %#v", k, m[k], want)
		}
	}
	members := m["members"].([]any)
	mem := members[0].(map[string]any)
	wantKeys(t, "member", mem, "id", "name", "peer_urls", "client_urls", "is_leader", "is_learner")
	if mem["id"] != "8e9e05c52164694d" || mem["is_leader"] != true || mem["name"] != "m1" {
		t.Errorf("member = %v", mem)
	}
	c := m["counts"].(map[string]any)
	wantKeys(t, "counts", c, "total", "starting", "serving", "draining", "healthy", "degraded",
		"unavailable", "unknown", "services")
	if c["total"] != 3.0 || c["services"] != 2.0 || c["draining"] != 1.0 {
		t.Errorf("counts = %v", c)
	}

	empty := decode(t, NewStatus(&registryv1.StatusResponse{}))
	if ms, ok := empty["members"].([]any); !ok || len(ms) != 0 {
		t.Errorf("no members = %#v, want []", empty["members"])
	}
}

func TestWatchLines(t *testing.T) {
	lines := func(r *registryv1.WatchResponse) []map[string]any {
		var out []map[string]any
		for _, l := range NewWatchLines(r) {
			out = append(out, decode(t, l))
		}
		return out
	}
	snap := lines(&registryv1.WatchResponse{Revision: 5, Kind: &registryv1.WatchResponse_Snapshot{Snapshot: &registryv1.Snapshot{}}})
	if len(snap) != 1 {
		t.Fatalf("snapshot lines = %v", snap)
	}
	wantKeys(t, "snapshot", snap[0], "type", "revision", "reset", "instances")
	if snap[0]["type"] != "snapshot" || snap[0]["reset"] != false || snap[0]["revision"] != 5.0 {
		t.Errorf("snapshot = %v", snap[0])
	}
	if is, ok := snap[0]["instances"].([]any); !ok || len(is) != 0 {
		t.Errorf("empty snapshot instances = %#v, want []", snap[0]["instances"])
	}

	evs := lines(&registryv1.WatchResponse{Revision: 7, Kind: &registryv1.WatchResponse_Events{Events: &registryv1.Events{Events: []*registryv1.Event{
		{Type: registryv1.Event_TYPE_PUT, Instance: fullInstance(), Service: "orders", Id: "o-1"},
		{Type: registryv1.Event_TYPE_DELETE, Service: "orders", Id: "o-2"},
	}}}})
	if len(evs) != 2 {
		t.Fatalf("event lines = %v", evs)
	}
	wantKeys(t, "put", evs[0], "type", "revision", "instance")
	if evs[0]["type"] != "put" || evs[0]["instance"].(map[string]any)["id"] != "o-1" || evs[0]["revision"] != 7.0 {
		t.Errorf("put = %v", evs[0])
	}
	wantKeys(t, "delete", evs[1], "type", "revision", "service", "id")
	if evs[1]["type"] != "delete" || evs[1]["service"] != "orders" || evs[1]["id"] != "o-2" {
		t.Errorf("delete = %v", evs[1])
	}

	epoch := lines(&registryv1.WatchResponse{Revision: 3, Kind: &registryv1.WatchResponse_Snapshot{Snapshot: &registryv1.Snapshot{
		Reset_: true, NewEpoch: true, Instances: []*registryv1.Instance{fullInstance()}}}})
	wantKeys(t, "new epoch snapshot", epoch[0], "type", "revision", "reset", "instances", "new_epoch")
	if epoch[0]["reset"] != true || epoch[0]["new_epoch"] != true || len(epoch[0]["instances"].([]any)) != 1 {
		t.Errorf("new epoch snapshot = %v", epoch[0])
	}

	prog := lines(&registryv1.WatchResponse{Revision: 9, Kind: &registryv1.WatchResponse_Progress{Progress: &registryv1.Progress{}}})
	wantKeys(t, "progress", prog[0], "type", "revision")
}

func TestAge(t *testing.T) {
	for d, want := range map[time.Duration]string{
		-time.Hour:                          "0s",
		0:                                   "0s",
		999 * time.Millisecond:              "0s",
		45 * time.Second:                    "45s",
		3*time.Minute + 12*time.Second:      "3m12s",
		3 * time.Minute:                     "3m",
		5*time.Hour + 3*time.Minute:         "5h3m",
		5*time.Hour + 59*time.Second:        "5h",
		50*time.Hour + 30*time.Minute:       "2d2h",
		72*time.Hour + 500*time.Millisecond: "3d",
	} {
		if got := Age(d); got != want {
			t.Errorf("Age(%s) = %q, want %q", d, got, want)
		}
	}
}

func TestCell(t *testing.T) {
	for in, want := range map[string]string{
		"":             "-",
		"plain":        "plain",
		"with space":   "with space",
		"tab\there":    `tab\there`,
		"line\nbreak":  `line\nbreak`,
		"nul\x00":      `nul\x00`,
		"bad\xffutf8":  `bad\xffutf8`,
		"ünïcode ✓":    "ünïcode ✓",
		`quote"back\\`: `quote"back\\`,
	} {
		if got := Cell(in); got != want {
			t.Errorf("Cell(%q) = %q, want %q", in, got, want)
		}
	}
}

func TestCheckString(t *testing.T) {
	for _, tc := range []struct {
		c    Check
		want string
	}{
		{Check{Kind: "NONE"}, "none"},
		{Check{}, "none"},
		{Check{Kind: "TCP"}, "tcp"},
		{Check{Kind: "HTTP", Target: "/healthz", Interval: "1s", Timeout: "500ms"}, "http /healthz every 1s, timeout 500ms"},
		{Check{Kind: "GRPC", Target: "orders.v1.Orders"}, "grpc orders.v1.Orders"},
	} {
		if got := tc.c.String(); got != tc.want {
			t.Errorf("%+v.String() = %q, want %q", tc.c, got, tc.want)
		}
	}
}

// fields splits a table into rows of whitespace-separated cells.
func fields(out string) [][]string {
	var rows [][]string
	for _, l := range strings.Split(strings.TrimRight(out, "\n"), "\n") {
		rows = append(rows, strings.Fields(l))
	}
	return rows
}

func TestWriteInstances(t *testing.T) {
	now := since.Add(3*time.Minute + 12*time.Second)
	insts := NewInstances([]*registryv1.Instance{
		fullInstance(),
		{Service: "billing", Id: "b-1", Address: "h:1", Weight: 100, Lifecycle: registryv1.Lifecycle_LIFECYCLE_SERVING},
	})
	var buf bytes.Buffer
	if err := WriteInstances(&buf, insts, false, now); err != nil {
		t.Fatal(err)
	}
	rows := fields(buf.String())
	want := [][]string{
		{"SERVICE", "ID", "ADDRESS", "ZONE", "WEIGHT", "LIFECYCLE", "HEALTH", "SINCE"},
		{"billing", "b-1", "h:1", "-", "100", "SERVING", "UNKNOWN", "-"},
		{"orders", "o-1", "10.0.0.7:8080", "eu-1a", "50", "DRAINING", "DEGRADED", "3m12s"},
	}
	if !reflect.DeepEqual(rows, want) {
		t.Errorf("table:\n%s\ngot  %q\nwant %q", buf.String(), rows, want)
	}
	// Aligned: every column starts at the same offset on every line.
	lines := strings.Split(strings.TrimRight(buf.String(), "\n"), "\n")
	col := strings.Index(lines[0], "ADDRESS")
	for _, l := range lines[1:] {
		if len(l) <= col || l[col-1] != ' ' || l[col] == ' ' {
			t.Errorf("ADDRESS column does not start at offset %d in %q", col, l)
		}
	}

	buf.Reset()
	if err := WriteInstances(&buf, insts, true, now); err != nil {
		t.Fatal(err)
	}
	rows = fields(buf.String())
	if want := []string{"SERVICE", "ID", "ADDRESS", "ZONE", "WEIGHT", "LIFECYCLE", "HEALTH", "SINCE",
		"VERSION", "LEASE", "MOD_REV", "REASON", "METADATA"}; !reflect.DeepEqual(rows[0], want) {
		t.Errorf("wide header = %q", rows[0])
	}
	o1 := buf.String()[strings.Index(buf.String(), "orders"):]
	for _, s := range []string{"1.2.3", "694d8a3c1f2b0e07", "17", "kernel upgrade; 3 slow probes", "az=eu-1a,tier=gold"} {
		if !strings.Contains(o1, s) {
			t.Errorf("wide row %q lacks %q", o1, s)
		}
	}

	buf.Reset()
	if err := WriteInstances(&buf, nil, false, now); err != nil {
		t.Fatal(err)
	}
	if buf.String() != "No instances found.\n" {
		t.Errorf("empty = %q", buf.String())
	}
}

func TestWriteInstance(t *testing.T) {
	var buf bytes.Buffer
	now := since.Add(time.Minute)
	if err := WriteInstance(&buf, NewInstance(fullInstance()), now); err != nil {
		t.Fatal(err)
	}
	out := buf.String()
	for _, want := range []string{
		"Service:", "orders", "Health:", "DEGRADED", "Health reason:", "3 slow probes",
		"Health since:", "2026-03-04T04:06:07.891011121Z (1m ago)", "Lifecycle reason:", "kernel upgrade",
		"Check:", "http /healthz every 1s, timeout 500ms", "Lease:", "694d8a3c1f2b0e07",
		"Observed by:", "regnode-2 (fence 42)", "Last probe latency:", "1.5ms", "az=eu-1a", "tier=gold",
	} {
		if !strings.Contains(out, want) {
			t.Errorf("block lacks %q:\n%s", want, out)
		}
	}
}

func TestWriteServicesAndStatus(t *testing.T) {
	var buf bytes.Buffer
	if err := WriteServices(&buf, []ServiceCounts{{Service: "orders", Total: 2, Serving: 1, Draining: 1, Unknown: 2}}, false); err != nil {
		t.Fatal(err)
	}
	want := [][]string{
		{"SERVICE", "TOTAL", "SERVING", "DRAINING", "HEALTHY", "DEGRADED", "UNAVAILABLE", "UNKNOWN"},
		{"orders", "2", "1", "1", "0", "0", "0", "2"},
	}
	if rows := fields(buf.String()); !reflect.DeepEqual(rows, want) {
		t.Errorf("services = %q", rows)
	}

	buf.Reset()
	if err := WriteStatus(&buf, NewStatus(&registryv1.StatusResponse{Node: "rn", Revision: 7,
		Members: []*registryv1.Member{{Id: 255, Name: "m1", ClientUrls: []string{"http://c"}, IsLeader: true}}}), false); err != nil {
		t.Fatal(err)
	}
	out := buf.String()
	for _, want := range []string{"Node:", "rn", "Revision:", "7", "MEMBER", "m1", "ff", "http://c", "yes"} {
		if !strings.Contains(out, want) {
			t.Errorf("status lacks %q:\n%s", want, out)
		}
	}
	for _, l := range strings.Split(out, "\n") {
		if strings.HasPrefix(l, "Prober leader:") && strings.TrimSpace(strings.TrimPrefix(l, "Prober leader:")) != "-" {
			t.Errorf("no leader shows %q, want -", l)
		}
	}
}
