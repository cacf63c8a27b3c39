package main

// Integration tests: the real regctl binary, run as a subprocess against a
// real regnode (embedded etcd) from internal/regnodetest.

import (
	"bufio"
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"net"
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
	clientv3 "go.etcd.io/etcd/client/v3"
	"go.uber.org/goleak"
	"google.golang.org/protobuf/types/known/durationpb"

	"github.com/regcluster/registry/client"
	"github.com/regcluster/registry/internal/etcdtest"
	"github.com/regcluster/registry/internal/regnodetest"
	registryv1 "github.com/regcluster/registry/proto/registry/v1"
	"github.com/regcluster/registry/record"
)

var (
	binDir    string
	buildOnce sync.Once
	regctlBin string
	buildErr  error
)

func TestMain(m *testing.M) {
	if addr := os.Getenv(watchChildEnv); addr != "" {
		os.Exit(watchChild(addr)) // this process is a test's Watch client (drain_wait_test.go)
	}
	if service := os.Getenv(xdsChildEnv); service != "" {
		os.Exit(xdsChild(service)) // this process is a test's xDS client (xds_test.go)
	}
	dir, err := os.MkdirTemp("", "regctl-test-")
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		os.Exit(1)
	}
	binDir = dir
	goleak.VerifyTestMain(m, append(etcdtest.LeakOptions(), goleak.Cleanup(func(code int) {
		os.RemoveAll(dir)
		os.Exit(code)
	}))...)
}

// binary builds regctl once (with -race if the tests run with it) and
// returns its path.
func binary(t *testing.T) string {
	t.Helper()
	buildOnce.Do(func() {
		regctlBin = filepath.Join(binDir, "regctl")
		args := []string{"build", "-o", regctlBin}
		if raceEnabled {
			args = append(args, "-race")
		}
		out, err := exec.Command("go", append(args, ".")...).CombinedOutput()
		if err != nil {
			buildErr = fmt.Errorf("go build regctl: %v\n%s", err, out)
		}
	})
	if buildErr != nil {
		t.Fatal(buildErr)
	}
	return regctlBin
}

// result is one finished regctl run.
type result struct {
	args           []string
	code           int
	stdout, stderr string
	took           time.Duration
}

func (r result) String() string {
	return fmt.Sprintf("regctl %q: exit %d after %s\nstdout: %q\nstderr: %q", r.args, r.code, r.took.Round(time.Millisecond), r.stdout, r.stderr)
}

// environ is the test's environment without REGCTL_ENDPOINTS, plus extra.
func environ(extra ...string) []string {
	var env []string
	for _, kv := range os.Environ() {
		if !strings.HasPrefix(kv, envEndpoints+"=") {
			env = append(env, kv)
		}
	}
	return append(env, extra...)
}

// regctl runs the binary with args and env (nil: the test's own, without
// REGCTL_ENDPOINTS) and waits for it to exit.
func regctl(t *testing.T, env []string, args ...string) result {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	cmd := exec.CommandContext(ctx, binary(t), args...)
	if env == nil {
		env = environ()
	}
	cmd.Env = env
	var out, errb bytes.Buffer
	cmd.Stdout, cmd.Stderr = &out, &errb
	start := time.Now()
	err := cmd.Run()
	r := result{args: args, stdout: out.String(), stderr: errb.String(), took: time.Since(start)}
	if ee, ok := err.(*exec.ExitError); ok {
		r.code = ee.ExitCode()
	} else if err != nil {
		t.Fatalf("run regctl %q: %v", args, err)
	}
	return r
}

// ctlOf returns a runner of regctl against addr.
func ctlOf(t *testing.T, addr string) func(args ...string) result {
	return func(args ...string) result {
		t.Helper()
		return regctl(t, nil, append([]string{"--endpoints", addr}, args...)...)
	}
}

func mustOK(t *testing.T, r result) result {
	t.Helper()
	if r.code != 0 || r.stderr != "" {
		t.Fatalf("want success and a quiet stderr; %v", r)
	}
	return r
}

// mustFail checks a failed run: exit code, nothing on stdout, and one line
// on stderr prefixed "regctl: " containing want (and no stack trace).
func mustFail(t *testing.T, r result, code int, want string) {
	t.Helper()
	if r.code != code {
		t.Errorf("want exit %d; %v", code, r)
	}
	if r.stdout != "" {
		t.Errorf("want nothing on stdout; %v", r)
	}
	if !strings.HasPrefix(r.stderr, "regctl: ") || strings.Count(r.stderr, "\n") != 1 || !strings.HasSuffix(r.stderr, "\n") {
		t.Errorf("want one stderr line prefixed \"regctl: \"; %v", r)
	}
	if !strings.Contains(r.stderr, want) {
		t.Errorf("want %q in stderr; %v", want, r)
	}
	for _, bad := range []string{"goroutine ", "panic", ".go:"} {
		if strings.Contains(r.stderr, bad) {
			t.Errorf("stderr looks like a stack trace (%q); %v", bad, r)
		}
	}
}

// apiClient is an SDK client of the regnode, closed when the test ends.
func apiClient(t *testing.T, addr string) registryv1.RegistryClient {
	t.Helper()
	c, err := client.New(client.Config{Endpoints: []string{addr}})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		if err := c.Close(); err != nil {
			t.Errorf("close client: %v", err)
		}
	})
	return c.API()
}

// seed registers inst for a minute (nothing keeps it alive) and returns its
// lease.
func seed(t *testing.T, api registryv1.RegistryClient, inst *registryv1.Instance) int64 {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	resp, err := api.Register(ctx, &registryv1.RegisterRequest{Instance: inst, Ttl: durationpb.New(time.Minute)})
	if err != nil {
		t.Fatalf("register %s/%s: %v", inst.Service, inst.Id, err)
	}
	return resp.LeaseId
}

// stored reads service/id straight from etcd; nil when absent.
func stored(t *testing.T, rn *regnodetest.Regnode, service, id string) *registryv1.Instance {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	keys := record.NewKeys(rn.Prefix)
	resp, err := rn.Etcd.Get(ctx, keys.Instance(service, id))
	if err != nil {
		t.Fatal(err)
	}
	if len(resp.Kvs) == 0 {
		return nil
	}
	kv := resp.Kvs[0]
	inst, err := keys.Decode(string(kv.Key), kv.Value, kv.CreateRevision, kv.ModRevision)
	if err != nil {
		t.Fatal(err)
	}
	return inst
}

// instanceKeys counts the instance keys in etcd under service (all if "").
func instanceKeys(t *testing.T, rn *regnodetest.Regnode, service string) int64 {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	keys := record.NewKeys(rn.Prefix)
	prefix := keys.Instances()
	if service != "" {
		prefix = keys.Service(service)
	}
	resp, err := rn.Etcd.Get(ctx, prefix, clientv3.WithPrefix(), clientv3.WithCountOnly())
	if err != nil {
		t.Fatal(err)
	}
	return resp.Count
}

func decodeJSON(t *testing.T, r result, v any) {
	t.Helper()
	if err := json.Unmarshal([]byte(r.stdout), v); err != nil {
		t.Fatalf("stdout is not JSON: %v; %v", err, r)
	}
}

// rows splits a table into rows of whitespace-separated cells.
func rows(out string) [][]string {
	var rs [][]string
	for _, l := range strings.Split(strings.TrimRight(out, "\n"), "\n") {
		rs = append(rs, strings.Fields(l))
	}
	return rs
}

func hex(id int64) string { return strconv.FormatUint(uint64(id), 16) }

var healthStates = []string{"UNKNOWN", "HEALTHY", "DEGRADED", "UNAVAILABLE"}

// TestCommands runs every read and write command against one regnode.
func TestCommands(t *testing.T) {
	rn := regnodetest.Start(t)
	ctl := ctlOf(t, rn.Addr)
	api := apiClient(t, rn.Addr)

	t.Run("empty", func(t *testing.T) {
		if r := mustOK(t, ctl("list", "-o", "json")); strings.TrimSpace(r.stdout) != "[]" {
			t.Errorf("empty list -o json: want [], %v", r)
		}
		if r := mustOK(t, ctl("services", "-o", "json")); strings.TrimSpace(r.stdout) != "[]" {
			t.Errorf("empty services -o json: want [], %v", r)
		}
		if r := mustOK(t, ctl("list")); r.stdout != "No instances found.\n" {
			t.Errorf("empty list: %v", r)
		}
	})

	o1 := &registryv1.Instance{Service: "orders", Id: "o-1", Address: "127.0.0.1:9101", Zone: "eu-1a",
		Version: "1.2.3", Weight: 50, Metadata: map[string]string{"az": "eu-1a", "tier": "gold"}}
	seeded := time.Now()
	lease1 := seed(t, api, o1)
	seed(t, api, &registryv1.Instance{Service: "orders", Id: "o-2", Address: "127.0.0.1:9102"})
	seed(t, api, &registryv1.Instance{Service: "billing", Id: "b-1", Address: "127.0.0.1:9201", Zone: "eu-1b"})

	t.Run("services", func(t *testing.T) {
		r := mustOK(t, ctl("services"))
		want := [][]string{
			{"SERVICE", "TOTAL", "SERVING", "DRAINING", "HEALTHY", "DEGRADED", "UNAVAILABLE", "UNKNOWN"},
			{"billing", "1", "1", "0"},
			{"orders", "2", "2", "0"},
		}
		got := rows(r.stdout)
		if len(got) != 3 || !slices.Equal(got[0], want[0]) || !slices.Equal(got[1][:4], want[1]) || !slices.Equal(got[2][:4], want[2]) {
			t.Errorf("services table: want rows starting %q; %v", want, r)
		}

		var counts []map[string]any
		decodeJSON(t, mustOK(t, ctl("services", "-o", "json")), &counts)
		if len(counts) != 2 || counts[0]["service"] != "billing" || counts[1]["service"] != "orders" {
			t.Fatalf("services -o json = %v", counts)
		}
		c := counts[1]
		if c["total"] != 2.0 || c["serving"] != 2.0 || c["draining"] != 0.0 || c["starting"] != 0.0 {
			t.Errorf("orders counts = %v", c)
		}
		sum := c["healthy"].(float64) + c["degraded"].(float64) + c["unavailable"].(float64) + c["unknown"].(float64)
		if sum != 2 {
			t.Errorf("orders health counts add up to %v, want 2: %v", sum, c)
		}
	})

	t.Run("list", func(t *testing.T) {
		r := mustOK(t, ctl("list"))
		got := rows(r.stdout)
		if want := []string{"SERVICE", "ID", "ADDRESS", "ZONE", "WEIGHT", "LIFECYCLE", "HEALTH", "SINCE"}; len(got) != 4 || !slices.Equal(got[0], want) {
			t.Fatalf("list: want header %q and 3 rows; %v", want, r)
		}
		var ids []string
		for _, row := range got[1:] {
			ids = append(ids, row[0]+"/"+row[1])
		}
		if want := []string{"billing/b-1", "orders/o-1", "orders/o-2"}; !slices.Equal(ids, want) {
			t.Errorf("list order = %v, want %v", ids, want)
		}
		if row := got[2]; row[2] != "127.0.0.1:9101" || row[3] != "eu-1a" || row[4] != "50" || row[5] != "SERVING" || !slices.Contains(healthStates, row[6]) {
			t.Errorf("o-1 row = %q", row)
		}
		if row := got[3]; row[3] != "-" || row[4] != "100" {
			t.Errorf("o-2 row (no zone, default weight) = %q", row)
		}

		r = mustOK(t, ctl("list", "orders"))
		if got := rows(r.stdout); len(got) != 3 || got[1][0] != "orders" || got[2][0] != "orders" {
			t.Errorf("list orders: %v", r)
		}
	})

	t.Run("list json", func(t *testing.T) {
		r := mustOK(t, ctl("list", "orders", "-o", "json"))
		var insts []map[string]any
		decodeJSON(t, r, &insts)
		if len(insts) != 2 || insts[0]["id"] != "o-1" || insts[1]["id"] != "o-2" {
			t.Fatalf("list orders -o json: %v", r)
		}
		i := insts[0]
		for _, k := range []string{"service", "id", "address", "zone", "version", "weight", "metadata",
			"lifecycle", "lifecycle_reason", "health", "check", "lease_id", "mod_revision", "create_revision", "registered_at"} {
			if _, ok := i[k]; !ok {
				t.Errorf("instance lacks %q: %v", k, i)
			}
		}
		for k, want := range map[string]any{"service": "orders", "address": "127.0.0.1:9101", "zone": "eu-1a",
			"version": "1.2.3", "weight": 50.0, "lifecycle": "SERVING", "lease_id": hex(lease1)} {
			if i[k] != want {
				t.Errorf("%s = %#v, want %#v", k, i[k], want)
			}
		}
		if md := i["metadata"].(map[string]any); md["az"] != "eu-1a" || md["tier"] != "gold" {
			t.Errorf("metadata = %v", md)
		}
		if i["mod_revision"].(float64) <= 0 || i["create_revision"].(float64) <= 0 {
			t.Errorf("revisions = %v, %v", i["mod_revision"], i["create_revision"])
		}
		reg, err := time.Parse(time.RFC3339Nano, i["registered_at"].(string))
		if err != nil || !strings.HasSuffix(i["registered_at"].(string), "Z") || reg.Before(seeded) || reg.After(time.Now()) {
			t.Errorf("registered_at = %v (%v), want an RFC 3339 UTC time between the registration (%v) and now", i["registered_at"], err, seeded)
		}
		h := i["health"].(map[string]any)
		if !slices.Contains(healthStates, h["state"].(string)) {
			t.Errorf("health.state = %v", h["state"])
		}
		for _, k := range []string{"state", "reason", "observer", "fence", "latency_ms"} {
			if _, ok := h[k]; !ok {
				t.Errorf("health lacks %q: %v", k, h)
			}
		}
		if c := i["check"].(map[string]any); c["kind"] != "NONE" {
			t.Errorf("check = %v", c)
		}
	})

	t.Run("list wide", func(t *testing.T) {
		r := mustOK(t, ctl("list", "orders", "-o", "wide"))
		got := rows(r.stdout)
		if want := []string{"SERVICE", "ID", "ADDRESS", "ZONE", "WEIGHT", "LIFECYCLE", "HEALTH", "SINCE",
			"VERSION", "LEASE", "MOD_REV", "REASON", "METADATA"}; len(got) != 3 || !slices.Equal(got[0], want) {
			t.Fatalf("list -o wide: want header %q; %v", want, r)
		}
		row := strings.Join(got[1], " ")
		for _, want := range []string{"1.2.3", hex(lease1), "az=eu-1a,tier=gold"} {
			if !strings.Contains(row, want) {
				t.Errorf("wide o-1 row %q lacks %q", row, want)
			}
		}
	})

	t.Run("get", func(t *testing.T) {
		r := mustOK(t, ctl("get", "orders/o-1"))
		for _, want := range []string{"Service:", "orders", "ID:", "o-1", "Address:", "127.0.0.1:9101",
			"Health:", "Health reason:", "Lifecycle:", "SERVING", "Lease:", hex(lease1), "az=eu-1a", "tier=gold"} {
			if !strings.Contains(r.stdout, want) {
				t.Errorf("get lacks %q; %v", want, r)
			}
		}
		var i map[string]any
		decodeJSON(t, mustOK(t, ctl("get", "orders/o-1", "-o", "json")), &i)
		if i["service"] != "orders" || i["id"] != "o-1" || i["weight"] != 50.0 || i["lease_id"] != hex(lease1) {
			t.Errorf("get -o json = %v", i)
		}
		mustFail(t, ctl("get", "orders/missing"), 1, "regctl: orders/missing not found")
		mustFail(t, ctl("get", "orders/missing", "-o", "json"), 1, "not found")
	})

	t.Run("drain and undrain", func(t *testing.T) {
		r := mustOK(t, ctl("drain", "orders/o-2", "--reason", "kernel upgrade"))
		if !strings.Contains(r.stdout, "orders/o-2 DRAINING") {
			t.Errorf("drain: %v", r)
		}
		if s := stored(t, rn, "orders", "o-2"); s.GetLifecycle() != registryv1.Lifecycle_LIFECYCLE_DRAINING || s.GetLifecycleReason() != "kernel upgrade" {
			t.Errorf("etcd after drain: %v", s)
		}
		wide := mustOK(t, ctl("list", "orders", "-o", "wide"))
		if !strings.Contains(wide.stdout, "DRAINING") || !strings.Contains(wide.stdout, "kernel upgrade") {
			t.Errorf("list -o wide after drain: %v", wide)
		}
		if g := mustOK(t, ctl("get", "orders/o-2")); !strings.Contains(g.stdout, "kernel upgrade") {
			t.Errorf("get after drain shows no reason: %v", g)
		}
		var counts []map[string]any
		decodeJSON(t, mustOK(t, ctl("services", "-o", "json")), &counts)
		if counts[1]["draining"] != 1.0 || counts[1]["serving"] != 1.0 {
			t.Errorf("services after drain = %v", counts[1])
		}

		var i map[string]any
		decodeJSON(t, mustOK(t, ctl("undrain", "orders/o-2", "-o", "json")), &i)
		if i["lifecycle"] != "SERVING" || i["id"] != "o-2" {
			t.Errorf("undrain -o json = %v", i)
		}
		if s := stored(t, rn, "orders", "o-2"); s.GetLifecycle() != registryv1.Lifecycle_LIFECYCLE_SERVING {
			t.Errorf("etcd after undrain: %v", s)
		}
		decodeJSON(t, mustOK(t, ctl("drain", "orders/o-2", "-o", "json")), &i)
		if i["lifecycle"] != "DRAINING" {
			t.Errorf("drain -o json = %v", i)
		}
		if r := mustOK(t, ctl("undrain", "orders/o-2")); !strings.Contains(r.stdout, "orders/o-2 SERVING") {
			t.Errorf("undrain: %v", r)
		}

		mustFail(t, ctl("drain", "orders/missing"), 1, "orders/missing not found")
		mustFail(t, ctl("undrain", "orders/missing"), 1, "orders/missing not found")
	})

	t.Run("deregister", func(t *testing.T) {
		r := mustOK(t, ctl("deregister", "orders/o-2"))
		if !strings.Contains(r.stdout, "orders/o-2 deregistered") {
			t.Errorf("deregister: %v", r)
		}
		if s := stored(t, rn, "orders", "o-2"); s != nil {
			t.Errorf("etcd still holds o-2: %v", s)
		}
		mustFail(t, ctl("deregister", "orders/o-2"), 1, "orders/o-2 not found")
		mustFail(t, ctl("get", "orders/o-2"), 1, "orders/o-2 not found")

		seed(t, api, &registryv1.Instance{Service: "orders", Id: "o-3", Address: "127.0.0.1:9103"})
		var d map[string]any
		decodeJSON(t, mustOK(t, ctl("deregister", "orders/o-3", "-o", "json")), &d)
		if d["service"] != "orders" || d["id"] != "o-3" || d["deleted"] != true || d["revision"].(float64) <= 0 {
			t.Errorf("deregister -o json = %v", d)
		}
	})

	t.Run("status", func(t *testing.T) {
		var s map[string]any
		decodeJSON(t, mustOK(t, ctl("status", "-o", "json")), &s)
		for _, k := range []string{"node", "leader", "revision", "compact_revision", "members", "cluster_id",
			"counts", "junk_skipped", "embedded", "etcd_version"} {
			if _, ok := s[k]; !ok {
				t.Errorf("status lacks %q: %v", k, s)
			}
		}
		if s["revision"].(float64) <= 0 || s["embedded"] != true || s["cluster_id"] == "" || s["etcd_version"] == "" {
			t.Errorf("status = %v", s)
		}
		members := s["members"].([]any)
		if len(members) != 1 {
			t.Fatalf("members = %v", members)
		}
		m := members[0].(map[string]any)
		if _, err := strconv.ParseUint(m["id"].(string), 16, 64); err != nil || m["is_leader"] != true || len(m["client_urls"].([]any)) == 0 || len(m["peer_urls"].([]any)) == 0 {
			t.Errorf("member = %v", m)
		}
		if c := s["counts"].(map[string]any); c["total"] != 2.0 || c["services"] != 2.0 {
			t.Errorf("counts = %v (want 2 instances in 2 services)", c)
		}
		// Every announced regnode's prober: here the one, owning every
		// checked instance (none has a check), with passing canaries.
		probing, _ := s["probing"].([]any)
		if len(probing) != 1 {
			t.Fatalf("probing = %v, want this regnode's", s["probing"])
		}
		if p := probing[0].(map[string]any); p["node"] != s["node"] || p["members"] != 1.0 || p["canary"] != "" || p["error"] != nil {
			t.Errorf("probing = %v", p)
		}

		r := mustOK(t, ctl("status"))
		for _, want := range []string{"Node:", s["node"].(string), "Prober leader:", "Revision:", "Compact revision:",
			"Cluster ID:", s["cluster_id"].(string), "MEMBER", m["id"].(string), m["name"].(string), "INSTANCES",
			"PROBER", "PROBES/S", "DISAGREEMENTS", "CANARIES", "pass"} {
			if !strings.Contains(r.stdout, want) {
				t.Errorf("status lacks %q; %v", want, r)
			}
		}
		wantLeader := s["leader"].(string)
		if wantLeader == "" {
			wantLeader = "-"
		}
		for _, l := range strings.Split(r.stdout, "\n") {
			if strings.HasPrefix(l, "Prober leader:") && strings.TrimSpace(strings.TrimPrefix(l, "Prober leader:")) != wantLeader {
				t.Errorf("status shows %q, want leader %q", l, wantLeader)
			}
		}
		if r := mustOK(t, ctl("status", "-o", "wide")); !strings.Contains(r.stdout, "PEER_URLS") {
			t.Errorf("status -o wide: %v", r)
		}
	})

	t.Run("endpoints from env", func(t *testing.T) {
		r := mustOK(t, regctl(t, environ(envEndpoints+"="+rn.Addr), "get", "orders/o-1"))
		if !strings.Contains(r.stdout, "o-1") {
			t.Errorf("env endpoints: %v", r)
		}
		// The flag wins over the environment.
		mustOK(t, regctl(t, environ(envEndpoints+"=127.0.0.1:1"), "--endpoints", rn.Addr, "get", "orders/o-1"))
	})
}

// lineReader collects a process's stdout lines.
type lineReader struct {
	lines chan string
}

func readLines(t *testing.T, cmd *exec.Cmd) *lineReader {
	t.Helper()
	pipe, err := cmd.StdoutPipe()
	if err != nil {
		t.Fatal(err)
	}
	lr := &lineReader{lines: make(chan string, 100)}
	go func() {
		defer close(lr.lines)
		sc := bufio.NewScanner(pipe)
		for sc.Scan() {
			lr.lines <- sc.Text()
		}
	}()
	return lr
}

// next returns the next line, or fails after d.
func (lr *lineReader) next(t *testing.T, d time.Duration) string {
	t.Helper()
	select {
	case l, ok := <-lr.lines:
		if !ok {
			t.Fatal("stdout closed; want another line")
		}
		return l
	case <-time.After(d):
		t.Fatalf("no stdout line within %s", d)
	}
	return ""
}

// rest returns the remaining lines until stdout closes.
func (lr *lineReader) rest(t *testing.T, d time.Duration) []string {
	t.Helper()
	var out []string
	deadline := time.After(d)
	for {
		select {
		case l, ok := <-lr.lines:
			if !ok {
				return out
			}
			out = append(out, l)
		case <-deadline:
			t.Fatalf("stdout still open after %s (lines so far %q)", d, out)
		}
	}
}

// etcdEvent is one etcd event on an instance key.
type etcdEvent struct {
	delete bool
	inst   *registryv1.Instance
}

// watchKey records every etcd event on service/id from now until the test
// ends; call the returned function to stop and get them.
func watchKey(t *testing.T, rn *regnodetest.Regnode, service, id string) func() []etcdEvent {
	t.Helper()
	keys := record.NewKeys(rn.Prefix)
	key := keys.Instance(service, id)
	ctx, cancel := context.WithCancel(context.Background())
	get, err := rn.Etcd.Get(ctx, key)
	if err != nil {
		cancel()
		t.Fatal(err)
	}
	wch := rn.Etcd.Watch(clientv3.WithRequireLeader(ctx), key, clientv3.WithRev(get.Header.Revision+1))
	var (
		mu     sync.Mutex
		events []etcdEvent
		done   = make(chan struct{})
	)
	go func() {
		defer close(done)
		for resp := range wch {
			for _, ev := range resp.Events {
				e := etcdEvent{delete: ev.Type == clientv3.EventTypeDelete}
				if !e.delete {
					inst, err := keys.Decode(string(ev.Kv.Key), ev.Kv.Value, ev.Kv.CreateRevision, ev.Kv.ModRevision)
					if err != nil {
						t.Errorf("etcd holds junk at %s: %v", key, err)
						continue
					}
					e.inst = inst
				}
				mu.Lock()
				events = append(events, e)
				mu.Unlock()
			}
		}
	}()
	stop := func() []etcdEvent {
		cancel()
		<-done
		mu.Lock()
		defer mu.Unlock()
		return events
	}
	t.Cleanup(func() { stop() })
	return stop
}

// TestRegister runs `regctl register` in the foreground, checks that it is
// listed, interrupts it, and checks from etcd itself that it went DRAINING,
// stayed so while the drain grace lasted, then was deleted. The grace is
// longer than any test: a second signal ends it, so what is checked is
// that the instance stays DRAINING until then, not how long it stayed.
func TestRegister(t *testing.T) {
	rn := regnodetest.Start(t)
	ctl := ctlOf(t, rn.Addr)
	events := watchKey(t, rn, "web", "w-1")

	cmd := exec.Command(binary(t), "--endpoints", rn.Addr, "register", "--service", "web", "--id", "w-1",
		"--address", "127.0.0.1:8080", "--ttl", "30s", "--drain-grace", "1h", "--weight", "7",
		"--meta", "k=v=w", "--zone", "z1", "--version", "v9", "--check", "http:/healthz",
		"--check-interval", "1s", "--check-timeout", "500ms")
	cmd.Env = environ()
	var stderr bytes.Buffer
	cmd.Stderr = &stderr
	out := readLines(t, cmd)
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	exited := false
	t.Cleanup(func() {
		if !exited {
			cmd.Process.Kill()
			out.rest(t, 10*time.Second)
			cmd.Wait()
		}
	})

	first := out.next(t, 30*time.Second)
	prefix := "registered web/w-1 (lease "
	if !strings.HasPrefix(first, prefix) {
		t.Fatalf("first line %q, want %q...", first, prefix)
	}
	lease := strings.SplitN(strings.TrimPrefix(first, prefix), ",", 2)[0]

	var listed []map[string]any
	deadline := time.Now().Add(time.Minute)
	for {
		decodeJSON(t, mustOK(t, ctl("list", "web", "-o", "json")), &listed)
		if len(listed) == 1 || time.Now().After(deadline) {
			break
		}
		time.Sleep(50 * time.Millisecond)
	}
	if len(listed) != 1 {
		t.Fatalf("list web never showed w-1: %v", listed)
	}
	i := listed[0]
	for k, want := range map[string]any{"id": "w-1", "address": "127.0.0.1:8080", "weight": 7.0, "zone": "z1",
		"version": "v9", "lifecycle": "SERVING", "lease_id": lease} {
		if i[k] != want {
			t.Errorf("listed %s = %#v, want %#v", k, i[k], want)
		}
	}
	if md := i["metadata"].(map[string]any); md["k"] != "v=w" || len(md) != 1 {
		t.Errorf("metadata = %v", md)
	}
	want := map[string]any{"kind": "HTTP", "target": "/healthz", "interval": "1s", "timeout": "500ms"}
	for k, v := range want {
		if c := i["check"].(map[string]any); c[k] != v {
			t.Errorf("check.%s = %v, want %v", k, c[k], v)
		}
	}

	// A live subscriber that never acknowledges the drain: the grace is
	// what ends the wait for it.
	sctx, stopSub := context.WithCancel(context.Background())
	defer stopSub()
	silent, err := apiClient(t, rn.Addr).Subscribe(sctx)
	if err != nil {
		t.Fatal(err)
	}
	if err := silent.Send(&registryv1.SubscribeRequest{Kind: &registryv1.SubscribeRequest_Add{Add: &registryv1.SubscribeAdd{Service: "web"}}}); err != nil {
		t.Fatal(err)
	}
	if _, err := silent.Recv(); err != nil {
		t.Fatal(err)
	}
	if err := cmd.Process.Signal(os.Interrupt); err != nil {
		t.Fatal(err)
	}
	if l, want := out.next(t, 30*time.Second), "draining web/w-1 until every subscriber applied it (at most 1h0m0s), then deregistering"; l != want {
		t.Fatalf("after the first signal %q, want %q", l, want)
	}
	// DRAINING lands in etcd, and the grace holds the delete back: the
	// instance is still there, DRAINING, as the regnode serves it.
	deadline = time.Now().Add(time.Minute)
	for {
		s := stored(t, rn, "web", "w-1")
		if s == nil {
			t.Fatal("w-1 deleted before the drain grace ended")
		}
		if s.Lifecycle == registryv1.Lifecycle_LIFECYCLE_DRAINING {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("w-1 never went DRAINING: %v", s)
		}
		time.Sleep(20 * time.Millisecond)
	}
	var got map[string]any
	decodeJSON(t, mustOK(t, ctl("get", "web/w-1", "-o", "json")), &got)
	if got["lifecycle"] != "DRAINING" {
		t.Fatalf("during the grace regnode serves w-1 as %v, want DRAINING", got["lifecycle"])
	}
	// The second signal ends the grace: deregistered at once.
	if err := cmd.Process.Signal(os.Interrupt); err != nil {
		t.Fatal(err)
	}
	rest := out.rest(t, 30*time.Second)
	err = cmd.Wait()
	exited = true
	if err != nil {
		t.Fatalf("register exited with %v; stdout %q; stderr %q", err, rest, stderr.String())
	}
	if stderr.Len() != 0 {
		t.Errorf("stderr %q, want nothing", stderr.String())
	}
	if want := []string{"deregistered web/w-1"}; !slices.Equal(rest, want) {
		t.Errorf("stdout after the second signal %q, want %q", rest, want)
	}

	mustFail(t, ctl("get", "web/w-1"), 1, "web/w-1 not found")
	if s := stored(t, rn, "web", "w-1"); s != nil {
		t.Errorf("etcd still holds w-1: %v", s)
	}

	evs := events()
	drained, deleted := -1, -1
	for n, e := range evs {
		switch {
		case e.delete:
			deleted = n
		case drained < 0 && e.inst.GetLifecycle() == registryv1.Lifecycle_LIFECYCLE_DRAINING:
			drained = n
		}
	}
	if drained < 0 || deleted != len(evs)-1 || drained > deleted {
		t.Fatalf("etcd events (drained at %d, deleted at %d of %d): want DRAINING, then the delete last", drained, deleted, len(evs))
	}
	if evs[drained].inst.GetLifecycleReason() == "" {
		t.Errorf("drained without a reason")
	}
}

// TestRegisterJSON checks register -o json's event lines and SIGTERM.
func TestRegisterJSON(t *testing.T) {
	rn := regnodetest.Start(t)
	cmd := exec.Command(binary(t), "--endpoints", rn.Addr, "-o", "json", "register", "--service", "web",
		"--id", "w-2", "--address", "127.0.0.1:8081", "--drain-grace", "100ms")
	cmd.Env = environ()
	var stderr bytes.Buffer
	cmd.Stderr = &stderr
	out := readLines(t, cmd)
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	exited := false
	t.Cleanup(func() {
		if !exited {
			cmd.Process.Kill()
			out.rest(t, 10*time.Second)
			cmd.Wait()
		}
	})
	lines := []string{out.next(t, 30*time.Second)}
	if err := cmd.Process.Signal(syscall.SIGTERM); err != nil {
		t.Fatal(err)
	}
	lines = append(lines, out.rest(t, 30*time.Second)...)
	err := cmd.Wait()
	exited = true
	if err != nil {
		t.Fatalf("register exited with %v; stdout %q; stderr %q", err, lines, stderr.String())
	}
	var got []string
	for _, l := range lines {
		var ev map[string]any
		if err := json.Unmarshal([]byte(l), &ev); err != nil {
			t.Fatalf("line %q is not JSON: %v", l, err)
		}
		if ev["service"] != "web" || ev["id"] != "w-2" {
			t.Errorf("event %v", ev)
		}
		got = append(got, ev["event"].(string))
		if ev["event"] == "registered" {
			if _, err := strconv.ParseUint(ev["lease_id"].(string), 16, 64); err != nil {
				t.Errorf("lease_id %v: %v", ev["lease_id"], err)
			}
		}
	}
	if want := []string{"registered", "draining", "deregistered"}; !slices.Equal(got, want) {
		t.Errorf("events %q, want %q", got, want)
	}
	if n := instanceKeys(t, rn, ""); n != 0 {
		t.Errorf("%d instance keys left in etcd", n)
	}
}

// TestBadInput checks that bad input fails with one clear line and the
// right exit code, and that nothing is written.
func TestBadInput(t *testing.T) {
	rn := regnodetest.Start(t)
	ctl := ctlOf(t, rn.Addr)
	api := apiClient(t, rn.Addr)

	t.Run("bad weight", func(t *testing.T) {
		mustFail(t, ctl("register", "--service", "web", "--id", "w-1", "--address", "127.0.0.1:8080", "--weight", "5000"),
			2, "regctl: --weight: invalid weight: 5000 is outside 1..1000")
		if n := instanceKeys(t, rn, ""); n != 0 {
			t.Errorf("%d instance keys in etcd after a refused register", n)
		}
	})

	t.Run("refused by the regnode", func(t *testing.T) {
		seed(t, api, &registryv1.Instance{Service: "web", Id: "w-9", Address: "127.0.0.1:8089"})
		before := stored(t, rn, "web", "w-9")
		mustFail(t, ctl("drain", "web/w-9", "--reason", strings.Repeat("x", 1100)), 1, "reason: 1100 bytes, at most 1024")
		if after := stored(t, rn, "web", "w-9"); after.GetModRevision() != before.GetModRevision() {
			t.Errorf("refused drain wrote: mod revision %d -> %d", before.GetModRevision(), after.GetModRevision())
		}
		// Someone else's live id: refused at once, not retried (the
		// regnode counts one refused registration, not one per retry).
		refused := func() float64 {
			return testutil.ToFloat64(rn.Node.Metrics().RegistrationErrors.WithLabelValues("AlreadyExists"))
		}
		refusedBefore := refused()
		r := ctl("register", "--service", "web", "--id", "w-9", "--address", "127.0.0.1:8089")
		mustFail(t, r, 1, "already registered")
		if n := refused() - refusedBefore; n != 1 {
			t.Errorf("the regnode refused %v registrations of w-9, want 1: AlreadyExists was retried", n)
		}
	})

	t.Run("usage", func(t *testing.T) {
		for _, tc := range []struct {
			args []string
			want string
		}{
			{[]string{"bogus"}, `unknown command "bogus"`},
			{[]string{"list", "--bogus"}, "unknown flag: --bogus"},
			{[]string{"get"}, "exactly one argument"},
			{[]string{"list", "a", "b"}, "at most one argument"},
			{[]string{"get", "orders"}, `"orders" is not SERVICE/ID`},
			{[]string{"get", "Orders/o-1"}, "invalid service"},
			{[]string{"drain", "orders/o 1"}, "invalid id"},
			{[]string{"deregister", "orders/"}, "is not SERVICE/ID"},
			{[]string{"-o", "yaml", "list"}, `invalid -o "yaml"`},
			{[]string{"register", "--service", "web", "--id", "w-1", "--address", "h:1", "--meta", "nokey"}, `invalid --meta "nokey"`},
			{[]string{"register", "--service", "web", "--id", "w-1", "--address", "h:1", "--check", "http:healthz"}, `invalid --check`},
			{[]string{"register", "--service", "web", "--id", "w-1"}, "--address is required"},
		} {
			r := ctl(tc.args...)
			mustFail(t, r, 2, tc.want)
			if !strings.Contains(r.stderr, "--help") {
				t.Errorf("usage error without a --help hint; %v", r)
			}
		}
		if n := instanceKeys(t, rn, "web"); n != 1 {
			t.Errorf("%d web instance keys, want only w-9", n)
		}
	})
}

// TestUnreachable checks that a regnode that cannot be reached is reported
// in one line naming the deadline that ended the wait. How long it took is
// not asserted (a loaded machine starts a race-enabled process slowly):
// a regctl that hung instead of giving up is killed by regctl's one-minute
// guard and fails on its exit code.
func TestUnreachable(t *testing.T) {
	// A port nobody listens on: connection refused.
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	refused := l.Addr().String()
	l.Close()

	// A listener that accepts and never answers: a hung regnode.
	silent, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	var wg sync.WaitGroup
	var mu sync.Mutex
	var conns []net.Conn
	wg.Add(1)
	go func() {
		defer wg.Done()
		for {
			c, err := silent.Accept()
			if err != nil {
				return
			}
			mu.Lock()
			conns = append(conns, c)
			mu.Unlock()
		}
	}()
	t.Cleanup(func() {
		silent.Close()
		wg.Wait()
		for _, c := range conns {
			c.Close()
		}
	})

	for _, tc := range []struct {
		name string
		args []string
		want string
	}{
		{"refused", []string{"--endpoints", refused, "--timeout", "3s", "list"}, "cannot reach a regnode at " + refused},
		{"refused status", []string{"--endpoints", refused, "status"}, "cannot reach a regnode at " + refused},
		{"silent", []string{"--endpoints", silent.Addr().String(), "--timeout", "1s", "get", "a/b"},
			"no answer from a regnode at " + silent.Addr().String() + " within 1s"},
		{"register", []string{"--endpoints", refused, "--timeout", "1s", "register", "--service", "web", "--id", "w-1", "--address", "127.0.0.1:1"},
			"could not register web/w-1 within 1s"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			mustFail(t, regctl(t, nil, tc.args...), 1, tc.want)
		})
	}
}
