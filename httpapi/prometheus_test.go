package httpapi_test

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"google.golang.org/protobuf/types/known/durationpb"

	"github.com/regcluster/registry/httpapi"
	"github.com/regcluster/registry/internal/etcdtest"
	registryv1 "github.com/regcluster/registry/proto/registry/v1"
)

// registerMeta registers service/id at addr with metadata md, for an hour.
func (f *fixture) registerMeta(t *testing.T, service, id, addr string, md map[string]string) {
	t.Helper()
	if _, err := f.rpc.Register(context.Background(), &registryv1.RegisterRequest{Ttl: durationpb.New(time.Hour),
		Instance: &registryv1.Instance{Service: service, Id: id, Address: addr, Zone: "z1", Version: "v1.2", Weight: 7, Metadata: md}}); err != nil {
		t.Fatalf("register %s/%s: %v", service, id, err)
	}
}

// The targets route answers http_sd_configs' format: one group per
// instance with its __meta_registry_* labels, metadata keys made
// label-safe, the scrape port from ?metrics_port=, else the instance's
// metadata metrics_port, else its address; ?service= lists one service.
func TestPrometheusTargets(t *testing.T) {
	f := start(t)
	f.registerMeta(t, "orders", "o-1", "10.0.0.1:8080", map[string]string{"metrics_port": "9100", "team.name": "pay", "a-b": "1"})
	f.registerMeta(t, "orders", "o-2", "[fd00::2]:8080", map[string]string{"metrics_port": "not-a-port"})
	f.registerMeta(t, "billing", "b-1", "10.0.0.3:8081", nil)

	get := func(path string) ([]httpapi.TargetGroup, int, http.Header) {
		t.Helper()
		code, body, hdr := f.do(t, "GET", path, "")
		var groups []httpapi.TargetGroup
		if code == http.StatusOK {
			if err := json.Unmarshal(body, &groups); err != nil {
				t.Fatalf("%s: %v: %s", path, err, body)
			}
		}
		return groups, code, hdr
	}
	groups, code, hdr := get("/api/v1/prometheus/targets")
	if code != 200 || hdr.Get("Content-Type") != "application/json" || len(groups) != 3 {
		t.Fatalf("targets: %d %q %v", code, hdr.Get("Content-Type"), groups)
	}
	byID := map[string]httpapi.TargetGroup{}
	for _, g := range groups {
		byID[g.Labels["__meta_registry_id"]] = g
	}
	o1 := byID["o-1"]
	want := map[string]string{
		"__meta_registry_service": "orders", "__meta_registry_id": "o-1", "__meta_registry_zone": "z1",
		"__meta_registry_version": "v1.2", "__meta_registry_health": "UNKNOWN", "__meta_registry_lifecycle": "SERVING",
		"__meta_registry_weight": "7", "__meta_registry_metadata_metrics_port": "9100",
		"__meta_registry_metadata_team_name": "pay", "__meta_registry_metadata_a_b": "1",
	}
	if !slices.Equal(o1.Targets, []string{"10.0.0.1:9100"}) || fmt.Sprint(o1.Labels) != fmt.Sprint(want) {
		t.Errorf("o-1: %v %v, want [10.0.0.1:9100] %v", o1.Targets, o1.Labels, want)
	}
	if got := byID["o-2"].Targets; !slices.Equal(got, []string{"[fd00::2]:8080"}) {
		t.Errorf("o-2 (metrics_port not a port): %v, want its own address", got)
	}
	if got := byID["b-1"].Targets; !slices.Equal(got, []string{"10.0.0.3:8081"}) {
		t.Errorf("b-1 (no metrics_port): %v, want its own address", got)
	}

	groups, _, _ = get("/api/v1/prometheus/targets?service=orders&metrics_port=9200")
	var targets []string
	for _, g := range groups {
		targets = append(targets, g.Targets...)
	}
	if !slices.Equal(targets, []string{"10.0.0.1:9200", "[fd00::2]:9200"}) {
		t.Errorf("?service=orders&metrics_port=9200: %v", targets)
	}
	if groups, code, _ := get("/api/v1/prometheus/targets?service=none"); code != 200 || groups == nil || len(groups) != 0 {
		t.Errorf("a service without instances: %d %v, want 200 []", code, groups)
	}
	for _, c := range []struct{ query, field string }{
		{"metrics_port=0", "metrics_port"}, {"metrics_port=65536", "metrics_port"}, {"metrics_port=x", "metrics_port"},
		{"service=Bad_Name", "service"}, {"port=1", "port"},
	} {
		code, body, _ := f.do(t, "GET", "/api/v1/prometheus/targets?"+c.query, "")
		var e apiErr
		if err := json.Unmarshal(body, &e); err != nil || code != 400 || e.Field != c.field {
			t.Errorf("?%s: %d %s, want 400 naming %s", c.query, code, body, c.field)
		}
	}
}

func TestLabelSafe(t *testing.T) {
	for in, want := range map[string]string{"team.name": "team_name", "a-b/c d": "a_b_c_d", "OK_9": "OK_9", "é": "__"} {
		if got := httpapi.LabelSafe(in); got != want {
			t.Errorf("LabelSafe(%q) = %q, want %q", in, got, want)
		}
	}
}

// lockedBuffer is a child process's output, written while the test reads.
type lockedBuffer struct {
	mu sync.Mutex
	b  bytes.Buffer
}

func (l *lockedBuffer) Write(p []byte) (int, error) {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.b.Write(p)
}

func (l *lockedBuffer) String() string {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.b.String()
}

// startPrometheus runs Debian's prometheus on loopback with a config that
// discovers its targets at sdURL every second, and returns its base URL.
// Without the binary the test is skipped, unless
// REGISTRY_REQUIRE_PROMETHEUS=1.
func startPrometheus(t *testing.T, sdURL string) (string, *lockedBuffer) {
	t.Helper()
	bin, err := exec.LookPath("prometheus")
	if err != nil {
		if os.Getenv("REGISTRY_REQUIRE_PROMETHEUS") == "1" {
			t.Fatalf("REGISTRY_REQUIRE_PROMETHEUS=1 but no prometheus binary: %v", err)
		}
		t.Skip("no prometheus binary (apt-get install prometheus; REGISTRY_REQUIRE_PROMETHEUS=1 makes this a failure)")
	}
	dir := t.TempDir()
	cfg := filepath.Join(dir, "prometheus.yml")
	if err := os.WriteFile(cfg, fmt.Appendf(nil, `global:
  scrape_interval: 1m
scrape_configs:
  - job_name: registry
    http_sd_configs:
      - url: %s
        refresh_interval: 1s
`, sdURL), 0o600); err != nil {
		t.Fatal(err)
	}
	addr := fmt.Sprintf("127.0.0.1:%d", etcdtest.FreePort(t))
	out := &lockedBuffer{}
	cmd := exec.Command(bin, "--config.file="+cfg, "--storage.tsdb.path="+filepath.Join(dir, "data"),
		"--web.listen-address="+addr, "--log.level=warn")
	cmd.Stdout, cmd.Stderr = out, out
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	done := make(chan struct{})
	go func() { cmd.Wait(); close(done) }()
	t.Cleanup(func() {
		cmd.Process.Kill()
		<-done
	})
	return "http://" + addr, out
}

// promTarget is one of Prometheus' active targets, as /api/v1/targets
// shows it.
type promTarget struct {
	DiscoveredLabels map[string]string `json:"discoveredLabels"`
	ScrapePool       string            `json:"scrapePool"`
}

// A real Prometheus, configured with http_sd_configs on the targets
// route, lists every registered instance with its labels, and drops one
// once it is deregistered.
func TestPrometheusDiscoversInstances(t *testing.T) {
	f := start(t)
	prom, out := startPrometheus(t, f.base+"/api/v1/prometheus/targets")
	f.registerMeta(t, "orders", "o-1", "127.0.0.1:9001", map[string]string{"metrics_port": "9101", "team.name": "pay"})
	f.registerMeta(t, "orders", "o-2", "127.0.0.1:9002", nil)
	f.registerMeta(t, "billing", "b-1", "127.0.0.1:9003", nil)

	hc := &http.Client{Timeout: 5 * time.Second}
	t.Cleanup(hc.CloseIdleConnections)
	active := func() map[string]promTarget {
		resp, err := hc.Get(prom + "/api/v1/targets?state=active")
		if err != nil {
			return nil // not up yet
		}
		defer resp.Body.Close()
		var body struct {
			Data struct {
				ActiveTargets []promTarget `json:"activeTargets"`
			} `json:"data"`
		}
		if err := json.NewDecoder(resp.Body).Decode(&body); err != nil {
			return nil
		}
		ts := map[string]promTarget{}
		for _, pt := range body.Data.ActiveTargets {
			ts[pt.DiscoveredLabels["__meta_registry_id"]] = pt
		}
		return ts
	}
	var ts map[string]promTarget
	waitUntil(t, time.Minute, "Prometheus to list o-1, o-2 and b-1", out, func() bool {
		ts = active()
		return len(ts) == 3 && ts["o-1"].ScrapePool != "" && ts["o-2"].ScrapePool != "" && ts["b-1"].ScrapePool != ""
	})
	o1 := ts["o-1"].DiscoveredLabels
	for k, v := range map[string]string{"__address__": "127.0.0.1:9101", "__meta_registry_service": "orders",
		"__meta_registry_zone": "z1", "__meta_registry_version": "v1.2", "__meta_registry_weight": "7",
		"__meta_registry_lifecycle": "SERVING", "__meta_registry_health": "UNKNOWN",
		"__meta_registry_metadata_team_name": "pay", "job": "registry"} {
		if o1[k] != v {
			t.Errorf("o-1's discovered label %s = %q, want %q (all: %v)", k, o1[k], v, o1)
		}
	}
	if got := ts["b-1"].DiscoveredLabels["__address__"]; got != "127.0.0.1:9003" {
		t.Errorf("b-1's __address__ = %q, want its own address", got)
	}

	if _, err := f.rpc.Deregister(context.Background(), &registryv1.DeregisterRequest{Service: "orders", Id: "o-2"}); err != nil {
		t.Fatal(err)
	}
	waitUntil(t, time.Minute, "Prometheus to drop o-2", out, func() bool {
		ts = active()
		_, o2 := ts["o-2"]
		return len(ts) == 2 && !o2
	})
}

// waitUntil polls cond until it holds, failing after d with the child's
// output.
func waitUntil(t *testing.T, d time.Duration, what string, out fmt.Stringer, cond func() bool) {
	t.Helper()
	deadline := time.Now().Add(d)
	for !cond() {
		if time.Now().After(deadline) {
			t.Fatalf("timed out after %s waiting for %s; output:\n%s", d, what, strings.TrimSpace(out.String()))
		}
		time.Sleep(100 * time.Millisecond)
	}
}
