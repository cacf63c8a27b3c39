package node_test

import (
	"context"
	"fmt"
	"net"
	"net/http"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/testutil"
	dto "github.com/prometheus/client_model/go"
	"github.com/prometheus/common/expfmt"
	"github.com/prometheus/common/model"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/credentials/insecure"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/types/known/durationpb"

	"github.com/regcluster/registry/internal/node"
	"github.com/regcluster/registry/internal/regnodetest"
	registryv1 "github.com/regcluster/registry/proto/registry/v1"
)

// scrape reads a regnode's /metrics over HTTP, as Prometheus would.
func scrape(addr string) ([]*dto.MetricFamily, error) {
	resp, err := http.Get("http://" + addr + "/metrics")
	if err != nil {
		return nil, err
	}
	defer resp.Body.Close()
	if resp.StatusCode != http.StatusOK {
		return nil, fmt.Errorf("GET /metrics: %s", resp.Status)
	}
	p := expfmt.NewTextParser(model.UTF8Validation)
	byName, err := p.TextToMetricFamilies(resp.Body)
	if err != nil {
		return nil, fmt.Errorf("parse /metrics: %w", err)
	}
	fams := make([]*dto.MetricFamily, 0, len(byName))
	for _, f := range byName {
		fams = append(fams, f)
	}
	return fams, nil
}

// sample is the value of name{labels} in fams, and whether it is there.
func sample(fams []*dto.MetricFamily, name string, labels map[string]string) (float64, bool) {
	for _, f := range fams {
		if f.GetName() != name {
			continue
		}
	next:
		for _, m := range f.GetMetric() {
			if len(m.GetLabel()) != len(labels) {
				continue
			}
			for _, l := range m.GetLabel() {
				if labels[l.GetName()] != l.GetValue() {
					continue next
				}
			}
			switch {
			case m.Gauge != nil:
				return m.Gauge.GetValue(), true
			case m.Counter != nil:
				return m.Counter.GetValue(), true
			}
		}
	}
	return 0, false
}

type series struct {
	name   string
	labels map[string]string
	want   float64 // -1: absent
}

func instances(service, lifecycle, health string, want float64) series {
	return series{"registry_instances", map[string]string{"service": service, "lifecycle": lifecycle, "health": health}, want}
}

// waitMetrics waits until every series has its value on addr's /metrics
// (the instance gauge follows the watch cache, a moment behind etcd).
func waitMetrics(t *testing.T, addr string, want ...series) {
	t.Helper()
	deadline := time.Now().Add(30 * time.Second)
	for {
		fams, err := scrape(addr)
		if err != nil {
			t.Fatal(err)
		}
		var wrong []string
		for _, s := range want {
			v, ok := sample(fams, s.name, s.labels)
			if (s.want < 0 && ok) || (s.want >= 0 && (!ok || v != s.want)) {
				wrong = append(wrong, fmt.Sprintf("%s%v = %v (present %v), want %v", s.name, s.labels, v, ok, s.want))
			}
		}
		if len(wrong) == 0 {
			return
		}
		if time.Now().After(deadline) {
			t.Fatalf("after 30s: %v", wrong)
		}
		time.Sleep(50 * time.Millisecond)
	}
}

// /metrics of a real regnode passes client_golang's linter, and its
// instance gauge and re-registration counter follow instances as they
// come, change state and go.
func TestMetricsFollowInstances(t *testing.T) {
	rn := regnodetest.Start(t)
	maddr := rn.Node.MetricsAddr()
	cc, err := grpc.NewClient(rn.Addr, grpc.WithTransportCredentials(insecure.NewCredentials()))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { cc.Close() })
	reg := registryv1.NewRegistryClient(cc)
	ctx := context.Background()
	// A live TCP endpoint for the prober: pay/p-1 turns HEALTHY.
	lis, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { lis.Close() })
	go func() {
		for {
			c, err := lis.Accept()
			if err != nil {
				return
			}
			c.Close()
		}
	}()

	secrets := map[string]string{} // by id: what each registration returned
	register := func(in *registryv1.Instance, secret string) error {
		// An hour's lease: nothing may expire while the test waits.
		resp, err := reg.Register(ctx, &registryv1.RegisterRequest{Instance: in, Ttl: durationpb.New(time.Hour), Secret: secret})
		if err == nil {
			secrets[in.Id] = resp.Secret
		}
		return err
	}
	for _, in := range []*registryv1.Instance{
		{Service: "orders", Id: "o-1", Address: "10.0.0.1:80"},
		{Service: "orders", Id: "o-2", Address: "10.0.0.2:80"},
		{Service: "pay", Id: "p-1", Address: lis.Addr().String(), Check: &registryv1.HealthCheck{Kind: registryv1.CheckKind_CHECK_KIND_TCP}},
	} {
		if err := register(in, ""); err != nil {
			t.Fatal(err)
		}
	}
	waitMetrics(t, maddr,
		instances("orders", "SERVING", "UNKNOWN", 2),
		instances("pay", "SERVING", "HEALTHY", 1),
		instances("pay", "SERVING", "UNKNOWN", -1),
		series{"registry_registrations_total", map[string]string{}, 3},
		series{"registry_reregistrations_total", map[string]string{}, 0})

	if _, err := reg.Drain(ctx, &registryv1.DrainRequest{Service: "orders", Id: "o-1"}); err != nil {
		t.Fatal(err)
	}
	waitMetrics(t, maddr, instances("orders", "SERVING", "UNKNOWN", 1), instances("orders", "DRAINING", "UNKNOWN", 1))

	// The same owner (its secret) replaces its own live record: a
	// re-registration, still one instance. Another is refused and counts
	// nothing.
	if err := register(&registryv1.Instance{Service: "orders", Id: "o-2", Address: "10.0.0.2:80"}, secrets["o-2"]); err != nil {
		t.Fatal(err)
	}
	if err := register(&registryv1.Instance{Service: "orders", Id: "o-2", Address: "10.0.0.2:80"}, ""); status.Code(err) != codes.AlreadyExists {
		t.Fatalf("register over another owner: %v, want AlreadyExists", err)
	}
	waitMetrics(t, maddr,
		series{"registry_reregistrations_total", map[string]string{}, 1},
		series{"registry_registrations_total", map[string]string{}, 4},
		instances("orders", "SERVING", "UNKNOWN", 1))

	if _, err := reg.Deregister(ctx, &registryv1.DeregisterRequest{Service: "pay", Id: "p-1"}); err != nil {
		t.Fatal(err)
	}
	waitMetrics(t, maddr, instances("pay", "SERVING", "HEALTHY", -1), instances("orders", "DRAINING", "UNKNOWN", 1))

	problems, err := testutil.GatherAndLint(prometheus.GathererFunc(func() ([]*dto.MetricFamily, error) { return scrape(maddr) }))
	if err != nil {
		t.Fatal(err)
	}
	for _, p := range problems {
		t.Errorf("lint: %s: %s", p.Metric, p.Text)
	}
}

// TestEnablePprof: runtime profiles are served on the metrics port only
// when asked for (--enable-pprof): they show what the process holds.
func TestEnablePprof(t *testing.T) {
	off := regnodetest.Start(t)
	on := regnodetest.StartWith(t, node.Config{EtcdEndpoints: []string{off.ClientURL}, EnablePprof: true}, off.ClientURL)
	get := func(addr, path string) int {
		t.Helper()
		resp, err := http.Get("http://" + addr + path)
		if err != nil {
			t.Fatal(err)
		}
		defer resp.Body.Close()
		return resp.StatusCode
	}
	for _, path := range []string{"/debug/pprof/", "/debug/pprof/goroutine?debug=1", "/debug/pprof/profile?seconds=1"} {
		if code := get(on.Node.MetricsAddr(), path); code != http.StatusOK {
			t.Errorf("with EnablePprof: GET %s = %d, want 200", path, code)
		}
	}
	if code := get(off.Node.MetricsAddr(), "/debug/pprof/goroutine?debug=1"); code == http.StatusOK {
		t.Errorf("without EnablePprof: GET /debug/pprof/goroutine = %d, want it not served", code)
	}
	if code := get(on.Node.MetricsAddr(), "/metrics"); code != http.StatusOK {
		t.Errorf("with EnablePprof: GET /metrics = %d", code)
	}
}
