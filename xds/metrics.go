package xds

import "github.com/prometheus/client_golang/prometheus"

// metrics are the Server's counts, registry_xds_*.
type metrics struct {
	streams      *prometheus.GaugeVec   // open ADS streams, by protocol (sotw, delta)
	requests     *prometheus.CounterVec // requests by kind: request, ack, nack
	pushes       *prometheus.CounterVec // responses sent, by protocol
	builds       prometheus.Counter     // builds that changed something
	buildSeconds prometheus.Histogram   // time to build and hand a change to the caches
	variants     prometheus.Counter     // assignment variants made
	panics       prometheus.Counter     // services entering panic
	panicking    prometheus.Gauge       // services in panic now
	pushSeconds  prometheus.Histogram   // from a build to each response carrying its version
	lastResorts  prometheus.Counter     // last resorts started
}

// newMetrics makes the Server's metrics; t's streams are counted by kind
// (registry_xds_clients, at each scrape) and its responses timed
// (registry_xds_push_seconds).
func newMetrics(reg prometheus.Registerer, t *tracker) *metrics {
	m := &metrics{
		streams: prometheus.NewGaugeVec(prometheus.GaugeOpts{Name: "registry_xds_streams",
			Help: "Open xDS (ADS) streams, by protocol (sotw: state of the world, delta: incremental)."}, []string{"protocol"}),
		requests: prometheus.NewCounterVec(prometheus.CounterOpts{Name: "registry_xds_requests_total",
			Help: "xDS requests by kind: request (new subscription), ack (a version applied), nack (a version refused)."}, []string{"kind"}),
		pushes: prometheus.NewCounterVec(prometheus.CounterOpts{Name: "registry_xds_responses_total",
			Help: "xDS responses sent, by protocol."}, []string{"protocol"}),
		builds: prometheus.NewCounter(prometheus.CounterOpts{Name: "registry_xds_builds_total",
			Help: "Changes of the registry turned into new xDS resources."}),
		buildSeconds: prometheus.NewHistogram(prometheus.HistogramOpts{Name: "registry_xds_build_seconds",
			Help: "Time to build a change's xDS resources and hand them to the caches.", Buckets: prometheus.ExponentialBuckets(0.0001, 4, 10)}),
		variants: prometheus.NewCounter(prometheus.CounterOpts{Name: "registry_xds_variants_total",
			Help: "Endpoint assignment variants made (by client kind and zone)."}),
		panics: prometheus.NewCounter(prometheus.CounterOpts{Name: "registry_xds_panic_entered_total",
			Help: "Services that entered panic (fewer routable instances than the threshold): every instance offered."}),
		panicking: prometheus.NewGauge(prometheus.GaugeOpts{Name: "registry_xds_panic_services",
			Help: "Services in panic now."}),
		lastResorts: prometheus.NewCounter(prometheus.CounterOpts{Name: "registry_xds_last_resort_started_total",
			Help: "Times most of a service's routable instances vanished by lease expiry at once and stayed offered as a last resort."}),
		pushSeconds: prometheus.NewHistogram(prometheus.HistogramOpts{Name: "registry_xds_push_seconds",
			Help:    "Time from the build of a registry change (its endpoints' new version) to each xDS response carrying it being handed to its stream (responses answering a new subscription not counted).",
			Buckets: prometheus.ExponentialBuckets(0.0005, 2, 14)}),
	}
	t.push = m.pushSeconds
	if reg != nil {
		reg.MustRegister(m.streams, m.requests, m.pushes, m.builds, m.buildSeconds, m.variants, m.panics, m.panicking, m.lastResorts,
			m.pushSeconds, &kindCollector{t: t})
	}
	return m
}

// kindCollector is registry_xds_clients: the open xDS streams by client
// kind (grpc, envoy, other: from the user agent), counted at each scrape.
type kindCollector struct{ t *tracker }

var clientsDesc = prometheus.NewDesc("registry_xds_clients",
	"Open xDS (ADS) streams, by client kind from the user agent (grpc, envoy, other; other also before a stream's first request).",
	[]string{"kind"}, nil)

func (c *kindCollector) Describe(ch chan<- *prometheus.Desc) { ch <- clientsDesc }

func (c *kindCollector) Collect(ch chan<- prometheus.Metric) {
	n := c.t.kinds()
	for _, k := range clientKinds {
		ch <- prometheus.MustNewConstMetric(clientsDesc, prometheus.GaugeValue, float64(n[k]), k)
	}
}
