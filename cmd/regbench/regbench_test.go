package main

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"math"
	"os"
	"strconv"
	"strings"
	"testing"
	"time"

	"go.uber.org/goleak"

	"github.com/regcluster/registry/internal/etcdtest"
)

// TestMain lets the test binary stand in for regbench as fanout's
// subscriber process (fanout re-executes os.Executable()).
func TestMain(m *testing.M) {
	if len(os.Args) > 1 && os.Args[1] == childArg {
		os.Exit(childMain(os.Args[2:], os.Stdin, os.Stdout))
	}
	if len(os.Args) > 1 && os.Args[1] == scaleChildArg {
		os.Exit(scaleChildMain(os.Args[2:], os.Stdin, os.Stdout))
	}
	if len(os.Args) > 1 && os.Args[1] == firstCallArg {
		os.Exit(firstCallMain(os.Args[2:]))
	}
	if len(os.Args) > 1 && os.Args[1] == probeTargetsArg {
		os.Exit(probeTargetsMain(os.Stdin, os.Stdout))
	}
	os.Exit(m.Run())
}

// tiny are parameters small enough for every scenario to run in seconds
// under the race detector; nothing here is timed.
var tiny = map[string][]string{
	"register": {"-register-conc", "1,4", "-register-ops-1", "16", "-register-ops-n", "32", "-register-rounds", "2"},
	"propagate": {"-propagate-subs", "1,3", "-propagate-writes", "8", "-propagate-rounds", "1",
		"-propagate-rate", "100", "-propagate-instances", "4", "-per-client", "2"},
	"compaction": {"-compaction-subs", "2", "-compaction-churn", "24", "-compaction-ring", "8",
		"-compaction-wait", "3s", "-propagate-instances", "4"},
	"failover": {"-failover-backends", "2", "-failover-trials", "1", "-failover-conns", "1", "-failover-rps", "20"},
	"fanout": {"-fanout-subs", "8", "-fanout-rate", "20", "-fanout-duration", "300ms", "-propagate-instances", "4",
		"-fanout-clients", "3"},
	"resync": {"-resync-instances", "300", "-resync-repeats", "1"},
	"pick":   {"-pick-endpoints", "2", "-pick-ops", "2000", "-pick-rounds", "1"},
	// Two fresh processes a side; their first calls must not fail.
	"firstcall": {"-firstcall-trials", "2"},
	// The default limits but a cap of 40 registrations: 120 Registers
	// from the attacker are limited without thousands of etcd writes.
	"flood": {"-flood-registers", "120", "-flood-conc", "8", "-flood-cap", "40", "-flood-calls", "20", "-flood-instances", "5"},
	// Real regnode processes (built once by the scenario), subscribers in
	// two child processes; bounded by its own deadline.
	// Real regnode processes (built once by the scenario) and a target
	// process; two steps a side, then a killed backend; bounded by its
	// own deadline.
	"probe": {"-probe-start", "30", "-probe-max", "60", "-probe-bisect", "0", "-probe-window", "2s", "-probe-warmup", "1s", "-probe-timed-every", "2",
		"-probe-deadline", "4m"},
	"scale": {"-scale-instances", "300", "-scale-subs", "30", "-scale-procs", "2", "-scale-changes", "10",
		"-scale-rate", "50", "-scale-roll", "5,10", "-scale-wave", "3", "-scale-timeout", "4m"},
}

// fields are figures a scenario's JSON must hold, by path from the top
// (ours/CASE/METRIC, baseline/NAME/CASE/METRIC, ratio/...), and whether
// they must be above zero (or only present and not negative).
type field struct {
	path     string
	positive bool
}

var fields = map[string][]field{
	"pick": {
		{"ours/N=2/ns_per_op", true}, {"ours/N=2/allocs_per_op", false}, {"ours/N=2/bytes_per_op", false},
		{"ours/N=2/parallel_ns_per_op", true}, {"baseline/round_robin/N=2/parallel_ns_per_op", true},
		{"ours/N=2/wrr_ns_per_op", true}, {"ours/N=2/wrr_parallel_ns_per_op", true}, {"ours/N=2/wrr_allocs_per_op", false},
		{"ours/N=2/p2c_in_retry_interceptor_ns_per_op", true}, {"ours/N=2/p2c_in_retry_interceptor_allocs_per_op", false},
		{"baseline/round_robin/N=2/ns_per_op", true}, {"baseline/round_robin/N=2/allocs_per_op", false},
		{"baseline/round_robin/N=2/bytes_per_op", false},
		{"ratio/round_robin/N=2/ns_per_op", true},
	},
	"flood": floodFields(floodPeer, floodToken),
	// xDS streams follow the same changes as SDK subscriptions.
	"propagate": {
		{"ours/S=3/latency_ms/n", true}, {"baseline/xds/S=3/latency_ms/n", true},
		{"baseline/etcd_watch/S=3/latency_ms/n", true}, {"baseline/xds/S=3/missed", false},
	},
	"firstcall": {
		{"ours/fresh process/start_to_first_ok_ms/n", true}, {"ours/fresh process/main_to_first_ok_ms/p50", true},
		{"baseline/round_robin/fresh process/start_to_first_ok_ms/n", true},
		{"ratio/round_robin/fresh process/start_to_first_ok_ms/p50", true},
		{"ours/fresh process/failed_before_first_ok", false},
	},
	"register": {
		{"ours/c=4/per_sec", true}, {"baseline/etcd_grant_put/c=4/per_sec", true},
		{"baseline/etcd_grant_only/c=4/per_sec", true},
		{"ours/c=4/process_cpu_us_per_op", true}, {"baseline/etcd_grant_put/c=4/process_cpu_us_per_op", true},
		{"baseline/etcd_grant_only/c=4/process_cpu_us_per_op", true},
		{"ratio/etcd_grant_put/c=4/per_sec", true},
		{"baseline/etcd_put_in_txn_of_64/c=4/process_cpu_us_per_op", true}, {"ours/c=4/ceiling_vs_raw", true},
	},
	"scale": {
		{"ours/N=300,S=30/rss_per_instance_kib", false}, {"baseline/etcd/N=300,S=30/rss_per_instance_kib", false},
		{"ours/N=300,S=30/cold_start_serving_ms", true}, {"ours/N=300,S=30/cold_start_full_snapshot_ms", true},
		{"baseline/etcd_get_decode/N=300,S=30/cold_start_full_snapshot_ms", true},
		{"ours/N=300,S=30/rss_per_subscriber_kib", false}, {"baseline/etcd/N=300,S=30/rss_per_subscriber_kib", false},
		{"ours/N=300,S=30/propagation_all_subscribers_ms/n", true}, {"baseline/etcd/N=300,S=30/propagation_all_subscribers_ms/n", true},
		{"ratio/etcd/N=300,S=30/propagation_all_subscribers_ms/p99", true},
		{"ours/N=300,S=30/propagation_changes_per_s", true}, {"baseline/etcd/N=300,S=30/propagation_changes_per_s", true},
		{"ours/roll M=5/call_retries", false},
		// Negative if the streams the children count fell short of one per
		// subscriber.
		{"ours/N=300,S=30/subscribe_all_stream_resumes", false}, {"ours/N=300,S=30/propagation_stream_resumes", false},
		{"ours/roll M=5/stream_resumes", false},
		{"ours/roll M=5/bytes_per_event", true}, {"ours/roll M=10/bytes_per_event", true},
		{"ours/kill rn3/moved_and_converged_ms/n", true},
	},
	"failover": {
		{"ours/B=2/calls", true}, {"ours/B=2/failed_calls", false}, {"ours/B=2/success_ratio", true},
		{"baseline/rr_registry/B=2/calls", true}, {"baseline/rr_registry/B=2/failed_calls", false},
		{"baseline/rr_registry/B=2/success_ratio", true},
		{"baseline/rr_etcd_naming/B=2/calls", true}, {"baseline/rr_etcd_naming/B=2/failed_calls", false},
		{"baseline/rr_etcd_naming/B=2/success_ratio", true},
		{"ours/B=2/removal_ms/n", true}, {"ours/B=2/retries", false}, {"ours/B=2/retry_budget_exhausted", false},
	},
}

// floodFields are the figures flood reports in each of modes.
func floodFields(modes ...string) []field {
	var fs []field
	for _, m := range modes {
		a, v := m+":attacker/", m+":victim_list/"
		fs = append(fs, field{"ours/" + a + "accepted", true}, field{"ours/" + a + "limited", true},
			field{"ours/" + a + "limited_registrations", true}, field{"ours/" + a + "regnode_limited_total", true},
			field{"ours/" + v + "latency_ms/n", true}, field{"baseline/idle/" + v + "latency_ms/n", true},
			field{"ratio/idle/" + v + "latency_ms/p99", true})
	}
	return fs
}

// at returns the number at a slash-separated path of a decoded JSON object.
func at(obj map[string]any, path string) (float64, bool) {
	var cur any = obj
	for _, k := range strings.Split(path, "/") {
		m, ok := cur.(map[string]any)
		if !ok {
			return 0, false
		}
		if cur, ok = m[k]; !ok {
			return 0, false
		}
	}
	f, ok := cur.(float64)
	return f, ok
}

// checkFields checks the fields of scenario in obj, and that each side's
// success_ratio is its calls that did not fail over its calls.
func checkFields(t *testing.T, scenario string, obj map[string]any) {
	t.Helper()
	for _, f := range fields[scenario] {
		v, ok := at(obj, f.path)
		switch {
		case !ok:
			t.Errorf("%s: no number at %s", scenario, f.path)
		case f.positive && v <= 0, v < 0:
			t.Errorf("%s: %s = %v, want > 0", scenario, f.path, v)
		}
	}
	if scenario == "flood" {
		// Counts, not durations, in each mode: the attacker's flood is
		// refused past its cap, all of it accounted for, and every call of
		// the victim's succeeded, idle, during the flood and after it (its
		// Registers, refused if the attacker's buckets were the victim's).
		for _, mode := range []string{floodPeer, floodToken} {
			a, v := "ours/"+mode+":attacker/", mode+":victim_list/"
			sent, _ := at(obj, a+"sent")
			accepted, _ := at(obj, a+"accepted")
			limited, _ := at(obj, a+"limited")
			if sent != 120 || accepted+limited != sent || accepted > 40 || limited == 0 {
				t.Errorf("flood %s: attacker sent %v, %v accepted, %v limited; want 120 sent, at most the cap of 40 accepted, the rest limited",
					mode, sent, accepted, limited)
			}
			for _, p := range []string{"ours/" + v + "failed", "baseline/idle/" + v + "failed", "ours/" + v + "registers_after_flood_failed"} {
				if n, ok := at(obj, p); !ok || n != 0 {
					t.Errorf("flood %s: %s = %v (present %v), want 0", mode, p, n, ok)
				}
			}
			if n, _ := at(obj, "ours/"+v+"registers_after_flood"); n != 5 {
				t.Errorf("flood %s: %v Registers after the flood, want 5", mode, n)
			}
			if idle, _ := at(obj, "baseline/idle/"+v+"latency_ms/n"); idle != 20 {
				t.Errorf("flood %s: %v idle Lists measured, want all 20", mode, idle)
			}
		}
	}
	if scenario == "scale" {
		// Counts: every restarted instance reached every subscriber as
		// one to three events (a deregistration's DRAINING mark, its
		// delete, the register; those in one batch are one update), and
		// nothing else did (no reset snapshot); every
		// subscriber of the killed regnode moved, every subscriber
		// converged, none went back.
		for _, M := range []float64{5, 10} {
			c := fmt.Sprintf("ours/roll M=%v/", M)
			written, _ := at(obj, c+"changes_written")
			events, _ := at(obj, c+"events_delivered")
			snaps, ok := at(obj, c+"snapshots_received")
			if written != 2*M || events < 30*M || events > 30*3*M || !ok || snaps != 0 {
				t.Errorf("scale roll M=%v: %v changes written, %v events delivered, %v snapshots (present %v); want %v, 30×%v..30×%v, 0",
					M, written, events, snaps, ok, 2*M, M, 3*M)
			}
		}
		moved, _ := at(obj, "ours/kill rn3/subscribers_moved")
		n, _ := at(obj, "ours/kill rn3/moved_and_converged_ms/n")
		conv, _ := at(obj, "ours/kill rn3/converged")
		regress, ok := at(obj, "ours/kill rn3/revision_regressions")
		if moved < 1 || n != moved || conv != 30 || !ok || regress != 0 {
			t.Errorf("scale kill: %v subscribers on the killed regnode, %v moved, %v of 30 converged, %v regressions (present %v)",
				moved, n, conv, regress, ok)
		}
		// The subscribers followed are those whose stream was on the
		// killed regnode, and every client's stream was somewhere.
		kill, _ := obj["ours"].(map[string]any)["kill rn3"].(map[string]any)
		before, _ := kill["streams_by_regnode_before"].(string)
		var total, onVictim float64
		for _, kv := range strings.Fields(before) {
			name, v, _ := strings.Cut(kv, "=")
			k, err := strconv.Atoi(v)
			if err != nil || name == "none" {
				t.Errorf("scale kill: streams before the kill %q", before)
			}
			total += float64(k)
			if name == "rn3" {
				onVictim = float64(k)
			}
		}
		if total != 30 || onVictim != moved {
			t.Errorf("scale kill: streams before the kill %q, %v followed as the killed regnode's", before, moved)
		}
		return
	}
	if scenario == "probe" {
		// Both sides probed every instance in every window, the timed
		// targets saw the probes the regnodes counted, every probe of a
		// deferred target passed as one of a timed target does, and the
		// killed backend went DEGRADED, then UNAVAILABLE.
		for _, side := range []string{"ours", "baseline/one_regnode"} {
			for _, n := range []int{30, 60} {
				c := fmt.Sprintf("%s/N=%d/", side, n)
				never, ok := at(obj, c+"never_probed")
				rate, _ := at(obj, c+"probes_per_s")
				seen, _ := at(obj, c+"probes_per_s_seen_by_targets")
				timed, _ := at(obj, c+"timed_instances")
				failed, fok := at(obj, c+"failed_probes")
				if !ok || never != 0 || rate <= 0 || math.Abs(seen-rate) > 0.2*rate || timed < float64(n)/2-1 || timed >= float64(n) {
					t.Errorf("probe %s: %v instances never probed (present %v), %v probes/s counted, %v seen by %v timed targets", c, never, ok, rate, seen, timed)
				}
				if !fok || failed != 0 {
					t.Errorf("probe %s: %v probes failed (present %v): a deferred target must pass as a timed one does", c, failed, fok)
				}
			}
			deg, _ := at(obj, side+"/capacity/detect_degraded_ms")
			unav, _ := at(obj, side+"/capacity/detect_unavailable_ms")
			if deg <= 0 || unav < deg {
				t.Errorf("probe %s: detected DEGRADED after %vms, UNAVAILABLE after %vms", side, deg, unav)
			}
		}
		if q, ok := at(obj, "ratio/rate_2_vs_1"); !ok || q <= 0 {
			t.Errorf("probe: ratio/rate_2_vs_1 = %v (present %v)", q, ok)
		}
		return
	}
	if scenario == "firstcall" {
		// A fresh process's channel waits for its first view: not one of
		// its calls fails before the first success.
		if f, ok := at(obj, "ours/fresh process/failed_before_first_ok"); !ok || f != 0 {
			t.Errorf("firstcall: %v calls of ours failed before the first success", f)
		}
		return
	}
	if scenario != "failover" {
		return
	}
	for _, side := range []string{"ours", "baseline/rr_registry", "baseline/rr_etcd_naming"} {
		calls, _ := at(obj, side+"/B=2/calls")
		failed, _ := at(obj, side+"/B=2/failed_calls")
		ratio, _ := at(obj, side+"/B=2/success_ratio")
		if calls > 0 && math.Abs(ratio-(calls-failed)/calls) > 1e-4 {
			t.Errorf("failover %s: success_ratio %v with %v failed of %v calls", side, ratio, failed, calls)
		}
	}
}

func TestScenariosJSON(t *testing.T) {
	existing := goleak.IgnoreCurrent()
	for _, s := range scenarios {
		t.Run(s.name, func(t *testing.T) {
			args := append([]string{s.name, "-json", "-timeout", "60s"}, tiny[s.name]...)
			var out, errb bytes.Buffer
			start := time.Now()
			if code := run(context.Background(), args, &out, &errb); code != 0 {
				t.Fatalf("regbench %s exited %d\nstdout:\n%s\nstderr:\n%s", strings.Join(args, " "), code, out.String(), errb.String())
			}
			t.Logf("%s: %.1fs", s.name, time.Since(start).Seconds())
			lines := strings.Split(strings.TrimSpace(out.String()), "\n")
			if len(lines) != 1 {
				t.Fatalf("want one JSON line, got %d:\n%s", len(lines), out.String())
			}
			var obj map[string]any
			if err := json.Unmarshal([]byte(lines[0]), &obj); err != nil {
				t.Fatalf("not JSON: %v\n%s", err, lines[0])
			}
			for _, k := range []string{"scenario", "params", "ours", "baseline", "ratio"} {
				if _, ok := obj[k]; !ok {
					t.Errorf("JSON lacks %q: %s", k, lines[0])
				}
			}
			if obj["scenario"] != s.name {
				t.Errorf("scenario = %v, want %s", obj["scenario"], s.name)
			}
			for _, k := range []string{"ours", "baseline"} {
				if m, _ := obj[k].(map[string]any); len(m) == 0 {
					t.Errorf("%s is empty: %s", k, lines[0])
				}
			}
			if e, ok := obj["error"]; ok {
				t.Errorf("error: %v", e)
			}
			checkFields(t, s.name, obj)
			// The table went to stderr, with the scenario's heading.
			if !strings.Contains(errb.String(), "== "+s.name) {
				t.Errorf("no table on stderr:\n%s", errb.String())
			}
		})
	}
	// Every goroutine a scenario started has been stopped.
	goleak.VerifyNone(t, append(etcdtest.LeakOptions(), existing)...)
}

func TestUsage(t *testing.T) {
	for _, args := range [][]string{nil, {"nope"}, {"register,nope"}, {"register,"}, {"register", "extra"}, {"register", "-no-such-flag"},
		{"scale", "-scale-procs", "0"}, {"scale", "-scale-rate", "-1"}} {
		var out, errb bytes.Buffer
		if code := run(context.Background(), args, &out, &errb); code != 2 {
			t.Errorf("regbench %q: exit %d, want 2", args, code)
		}
		if !strings.Contains(errb.String(), "usage: regbench SCENARIO") {
			t.Errorf("regbench %q: no usage on stderr: %s", args, errb.String())
		}
		for _, want := range []string{" pick ", " failover ", "-pick-endpoints", "-failover-work"} {
			if !strings.Contains(errb.String(), want) {
				t.Errorf("regbench %q: usage lacks %q: %s", args, want, errb.String())
			}
		}
	}
}

func TestSeveralScenarios(t *testing.T) {
	name, _, err := parse([]string{"register,resync", "-short"}, &bytes.Buffer{})
	if err != nil || name != "register,resync" {
		t.Fatalf("parse: %q, %v", name, err)
	}
}

func TestShortKeepsExplicitFlags(t *testing.T) {
	_, c, err := parse([]string{"fanout", "-short", "-fanout-subs", "7"}, &bytes.Buffer{})
	if err != nil {
		t.Fatal(err)
	}
	if c.fanSubs != 7 || c.resyncN != 20000 || len(c.propSubs) != 3 || c.propSubs[2] != 300 {
		t.Errorf("short config: fanSubs %d resyncN %d propSubs %v", c.fanSubs, c.resyncN, c.propSubs)
	}
}

func TestCPUBySide(t *testing.T) {
	stop := make(chan struct{})
	done := make(chan struct{})
	labeled(sideRegnode, func() {
		go func() {
			defer close(done)
			x := 0
			for {
				select {
				case <-stop:
					return
				default:
					x++
				}
			}
		}()
	})
	by, err := cpuProfile(func() { time.Sleep(300 * time.Millisecond) })
	close(stop)
	<-done
	if err != nil {
		t.Skipf("CPU profile unavailable: %v", err)
	}
	if by[sideRegnode] <= 0 {
		t.Errorf("no CPU attributed to the regnode label: %v", by)
	}
}

func TestLatencies(t *testing.T) {
	t0 := time.Now()
	o := &observer{}
	o.saw(5, t0.Add(3*time.Millisecond))
	o.saw(9, t0.Add(10*time.Millisecond))
	ds, early, missed := latencies([]commit{{4, t0}, {7, t0.Add(time.Millisecond)}, {9, t0.Add(11 * time.Millisecond)}, {12, t0}}, []*observer{o})
	if len(ds) != 3 || ds[0] != 3*time.Millisecond || ds[1] != 9*time.Millisecond || ds[2] != 0 || early != 1 || missed != 1 {
		t.Errorf("latencies = %v early %d missed %d", ds, early, missed)
	}
	l := summarize([]time.Duration{time.Millisecond, 2 * time.Millisecond, 3 * time.Millisecond, 100 * time.Millisecond})
	if l.P50 != 2 || l.P99 != 100 || l.Max != 100 || l.N != 4 {
		t.Errorf("summarize = %+v", l)
	}
}
