package metrics

import (
	"strings"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/regcluster/registry/cache"
	registryv1 "github.com/regcluster/registry/proto/registry/v1"
)

// instancesDesc is registry_instances: the instances this regnode's cache
// holds, by service, lifecycle and health.
var instancesDesc = prometheus.NewDesc("registry_instances",
	"Instances in this regnode's watch cache, by service, lifecycle (STARTING, SERVING, DRAINING) and health (UNKNOWN, HEALTHY, DEGRADED, UNAVAILABLE); a combination with no instance has no series.",
	[]string{"service", "lifecycle", "health"}, nil)

// instances counts a cache snapshot at scrape time: no etcd read, no work
// per event, and the counts are always those of one revision.
type instances struct {
	view func() *cache.Snapshot
}

func (c instances) Describe(ch chan<- *prometheus.Desc) { ch <- instancesDesc }

func (c instances) Collect(ch chan<- prometheus.Metric) {
	snap := c.view()
	if snap == nil {
		return
	}
	type key struct{ lifecycle, health string }
	for _, svc := range snap.Services() {
		counts := map[key]int{}
		for in := range snap.Each(svc) { // the cache's tree: no flat copy built
			counts[key{lifecycleName(in.GetLifecycle()), healthName(in.GetHealth().GetState())}]++
		}
		for k, n := range counts {
			ch <- prometheus.MustNewConstMetric(instancesDesc, prometheus.GaugeValue, float64(n), svc, k.lifecycle, k.health)
		}
	}
}

// lifecycleName counts an unspecified lifecycle as SERVING: that is what
// registering means (as regctl services counts it).
func lifecycleName(l registryv1.Lifecycle) string {
	if l == registryv1.Lifecycle_LIFECYCLE_UNSPECIFIED {
		l = registryv1.Lifecycle_LIFECYCLE_SERVING
	}
	return strings.TrimPrefix(l.String(), "LIFECYCLE_")
}

// healthName names a health state; no verdict yet is UNKNOWN (state 0).
func healthName(h registryv1.HealthState) string {
	return strings.TrimPrefix(h.String(), "HEALTH_STATE_")
}

// WatchInstances serves registry_instances from view, called at every
// scrape (typically a cache's Snapshot method). Call it once.
func (m *Metrics) WatchInstances(view func() *cache.Snapshot) {
	m.Registry.MustRegister(instances{view: view})
}
