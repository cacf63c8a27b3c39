package balance_test

import (
	"strings"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/testutil"

	"github.com/regcluster/registry/balance"
)

// Metrics is a client_golang collector of the balancer's counts.
func TestMetricsCollector(t *testing.T) {
	bs := startBackends(t, 2)
	p := balance.DefaultPolicy()
	m := balance.NewMetrics()
	reg := prometheus.NewPedanticRegistry()
	if err := reg.Register(m); err != nil {
		t.Fatal(err)
	}
	ch := newChannel(t, p, state(t, p, m, true, serving(bs[0], 100), serving(bs[1], 300)))
	waitAllConnected(t, ch, bs)
	for range 10 {
		if err := ch.check("", 5*time.Second); err != nil {
			t.Fatal(err)
		}
	}
	picks := m.Counts().Picks
	err := testutil.GatherAndCompare(reg, strings.NewReader(`
# HELP registry_client_instance_weight Weight the latest picker gives each instance (slow start included).
# TYPE registry_client_instance_weight gauge
registry_client_instance_weight{id="b0",service="orders"} 100
registry_client_instance_weight{id="b1",service="orders"} 300
`), "registry_client_instance_weight")
	if err != nil {
		t.Fatal(err)
	}
	if n, err := testutil.GatherAndCount(reg, "registry_client_picks_total"); err != nil || n != 2 {
		t.Fatalf("picks series: %d, %v", n, err)
	}
	if picks["orders/b0"]+picks["orders/b1"] < 10 {
		t.Fatalf("picks %v", picks)
	}
	if n, err := testutil.GatherAndCount(reg); err != nil || n < 11 {
		t.Fatalf("%d series, %v", n, err)
	}
}
