package balance

import (
	"time"

	"github.com/prometheus/client_golang/prometheus"
)

var (
	descPicks = prometheus.NewDesc("registry_client_picks_total",
		"Calls the balancer sent to each instance.", []string{"service", "id"}, nil)
	descWeight = prometheus.NewDesc("registry_client_instance_weight",
		"Weight the latest picker gives each instance (slow start included).", []string{"service", "id"}, nil)
	descEjections = prometheus.NewDesc("registry_client_ejections_total",
		"Instances ejected by passive outlier detection.", nil, nil)
	descReturns = prometheus.NewDesc("registry_client_ejection_returns_total",
		"Ejected instances brought back by half-open successes.", nil, nil)
	descCapped = prometheus.NewDesc("registry_client_ejections_capped_total",
		"Ejections refused because the share of ejected instances was at its maximum.", nil, nil)
	descProbes = prometheus.NewDesc("registry_client_half_open_calls_total",
		"Calls let through to an ejected instance to test it.", nil, nil)
	descPanicEnters = prometheus.NewDesc("registry_client_panic_entered_total",
		"Times a channel entered panic mode.", nil, nil)
	descPanicking = prometheus.NewDesc("registry_client_panic_channels",
		"Channels in panic mode now.", nil, nil)
	descRetries = prometheus.NewDesc("registry_client_retries_total",
		"Retry attempts made.", nil, nil)
	descExhausted = prometheus.NewDesc("registry_client_retry_budget_exhausted_total",
		"Retries refused by the retry budget.", nil, nil)
	descNoInstance = prometheus.NewDesc("registry_client_no_instance_total",
		"Calls failed because no instance could be called.", nil, nil)
	descDiskLoads = prometheus.NewDesc("registry_client_disk_cache_loads_total",
		"Last-known-good views served from disk because no regnode answered yet.", nil, nil)
	descDiskAge = prometheus.NewDesc("registry_client_disk_cache_age_seconds",
		"Age of the last-known-good view each service is served from now (absent once live).", []string{"service"}, nil)
	descCoalesced = prometheus.NewDesc("registry_client_callbacks_coalesced_total",
		"Times a subscription's callbacks fell too far behind and the changes waiting for them were replaced by one snapshot.", []string{"service"}, nil)
	descLastResorts = prometheus.NewDesc("registry_client_last_resort_started_total",
		"Times most of a service's routable instances vanished by lease expiry at once and were kept as a last resort.", nil, nil)
	descLastResortHeld = prometheus.NewDesc("registry_client_last_resort_instances",
		"Vanished instances each service holds as a last resort now, called only while nothing else is routable (absent when none).", []string{"service"}, nil)
)

// Describe implements prometheus.Collector: register a Metrics with the
// application's registry to export it.
func (m *Metrics) Describe(ch chan<- *prometheus.Desc) {
	for _, d := range []*prometheus.Desc{descPicks, descWeight, descEjections, descReturns, descCapped, descProbes,
		descPanicEnters, descPanicking, descRetries, descExhausted, descNoInstance, descDiskLoads, descDiskAge, descCoalesced,
		descLastResorts, descLastResortHeld} {
		ch <- d
	}
}

// Collect implements prometheus.Collector.
func (m *Metrics) Collect(ch chan<- prometheus.Metric) {
	c := m.Counts()
	counter := func(d *prometheus.Desc, v int64) {
		ch <- prometheus.MustNewConstMetric(d, prometheus.CounterValue, float64(v))
	}
	counter(descEjections, c.Ejections)
	counter(descReturns, c.Returns)
	counter(descCapped, c.EjectionsCapped)
	counter(descProbes, c.HalfOpenProbes)
	counter(descPanicEnters, c.PanicEnters)
	counter(descRetries, c.Retries)
	counter(descExhausted, c.BudgetExhausted)
	counter(descNoInstance, c.NoInstance)
	counter(descDiskLoads, c.DiskLoads)
	counter(descLastResorts, c.LastResorts)
	for svc, n := range c.LastResortHeld {
		ch <- prometheus.MustNewConstMetric(descLastResortHeld, prometheus.GaugeValue, float64(n), svc)
	}
	for svc, saved := range c.DiskSavedAt {
		ch <- prometheus.MustNewConstMetric(descDiskAge, prometheus.GaugeValue, time.Since(saved).Seconds(), svc)
	}
	for svc, n := range c.CallbacksCoalesced {
		ch <- prometheus.MustNewConstMetric(descCoalesced, prometheus.CounterValue, float64(n), svc)
	}
	ch <- prometheus.MustNewConstMetric(descPanicking, prometheus.GaugeValue, float64(c.Panicking))
	for k, v := range c.Picks {
		svc, id := split(k)
		ch <- prometheus.MustNewConstMetric(descPicks, prometheus.CounterValue, float64(v), svc, id)
	}
	for k, v := range c.Weights {
		svc, id := split(k)
		ch <- prometheus.MustNewConstMetric(descWeight, prometheus.GaugeValue, float64(v), svc, id)
	}
}

func split(k string) (service, id string) {
	for i := 0; i < len(k); i++ {
		if k[i] == '/' {
			return k[:i], k[i+1:]
		}
	}
	return k, ""
}
