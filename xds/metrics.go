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
}

func newMetrics(reg prometheus.Registerer) *metrics {
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
	}
	if reg != nil {
		reg.MustRegister(m.streams, m.requests, m.pushes, m.builds, m.buildSeconds, m.variants, m.panics, m.panicking)
	}
	return m
}
