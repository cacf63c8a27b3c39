// Package metrics holds the registry_* Prometheus metrics of one regnode,
// on a registry of its own (never the process-wide default), so several
// regnodes can live in one test process.
package metrics

import (
	"context"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/collectors"
	"google.golang.org/grpc"
	"google.golang.org/grpc/status"
)

// Metrics are the counters regnode keeps. Every field is safe for
// concurrent use. registry_instances is not a field: it is counted from a
// cache view at scrape time (see WatchInstances).
type Metrics struct {
	// Registry is what /metrics serves.
	Registry *prometheus.Registry

	Registrations      prometheus.Counter
	ReRegistrations    prometheus.Counter     // replaced the instance's own record (same owner: its secret)
	RegistrationErrors *prometheus.CounterVec // by gRPC code
	KeepAlives         prometheus.Counter
	KeepAliveLost      prometheus.Counter
	KeepAliveFailures  prometheus.Counter
	KeepAliveStreams   prometheus.Gauge
	JunkSkipped        prometheus.Counter
	LifecycleWrites    *prometheus.CounterVec // by lifecycle
	Deregistrations    prometheus.Counter
	Subscribers        prometheus.Gauge
	Acks               prometheus.Counter     // acknowledgements received on Subscribe streams
	AckRequests        prometheus.Counter     // AckRequests sent on Subscribe streams
	ResetsSent         *prometheus.CounterVec // by reason
	WatchRestarts      *prometheus.CounterVec // by reason
	StaleBatches       prometheus.Counter
	Probes             *prometheus.CounterVec // by result: ok, slow, timeout, error, unhealthy
	ProbeSeconds       prometheus.Histogram
	Transitions        *prometheus.CounterVec // by from, to
	FenceRejections    prometheus.Counter
	LeaderChanges      prometheus.Counter
	Leading            prometheus.Gauge
	Requests           *prometheus.CounterVec   // by method, code
	RequestSeconds     *prometheus.HistogramVec // by method
	Limited            *prometheus.CounterVec   // calls refused by a per-peer limit, by limit
	NotOwner           *prometheus.CounterVec   // calls refused for want of the registration's secret, by method
	DNSQueries         *prometheus.CounterVec   // DNS queries (--dns-listen), by result (package dnsapi's Results)
	ProbeOwned         prometheus.Gauge         // checked instances in this regnode's share
	Disagreements      prometheus.Counter       // evictions another regnode's probe did not confirm
	DemotionsHeld      *prometheus.CounterVec   // by reason: canary, mass
	Confirmations      *prometheus.CounterVec   // ConfirmProbe asked of other regnodes, by result
	Reports            *prometheus.CounterVec   // callers' reports taken on Subscribe streams, by result
}

// New creates the metrics on a fresh registry that also carries the Go
// runtime and process collectors.
func New() *Metrics {
	r := prometheus.NewRegistry()
	r.MustRegister(collectors.NewGoCollector(), collectors.NewProcessCollector(collectors.ProcessCollectorOpts{}))
	m := &Metrics{
		Registry:           r,
		Registrations:      prometheus.NewCounter(prometheus.CounterOpts{Name: "registry_registrations_total", Help: "Instances registered (each lease granted and put)."}),
		ReRegistrations:    prometheus.NewCounter(prometheus.CounterOpts{Name: "registry_reregistrations_total", Help: "Registers by the same owner (its secret) that replaced its record still alive under an older lease, or came back after the lease was lost."}),
		RegistrationErrors: prometheus.NewCounterVec(prometheus.CounterOpts{Name: "registry_registration_errors_total", Help: "Registrations refused or failed, by gRPC code."}, []string{"code"}),
		KeepAlives:         prometheus.NewCounter(prometheus.CounterOpts{Name: "registry_keepalives_total", Help: "Lease renewals served."}),
		KeepAliveLost:      prometheus.NewCounter(prometheus.CounterOpts{Name: "registry_keepalive_lost_total", Help: "Renewals of leases that no longer exist (the instance must register again)."}),
		KeepAliveFailures:  prometheus.NewCounter(prometheus.CounterOpts{Name: "registry_keepalive_failures_total", Help: "Renewals that failed on etcd."}),
		KeepAliveStreams:   prometheus.NewGauge(prometheus.GaugeOpts{Name: "registry_keepalive_streams", Help: "Open KeepAlive streams."}),
		JunkSkipped:        prometheus.NewCounter(prometheus.CounterOpts{Name: "registry_junk_records_skipped_total", Help: "Records under the prefix that are not valid instances, skipped by readers."}),
		LifecycleWrites:    prometheus.NewCounterVec(prometheus.CounterOpts{Name: "registry_lifecycle_writes_total", Help: "Drain and undrain writes, by resulting lifecycle."}, []string{"lifecycle"}),
		Deregistrations:    prometheus.NewCounter(prometheus.CounterOpts{Name: "registry_deregistrations_total", Help: "Instances deleted by Deregister."}),
		Subscribers:        prometheus.NewGauge(prometheus.GaugeOpts{Name: "registry_subscribers", Help: "Subscriptions served by this regnode: each Watch stream, and each service followed on a Subscribe stream."}),
		Acks:               prometheus.NewCounter(prometheus.CounterOpts{Name: "registry_subscriber_acks_total", Help: "Acknowledgements of an applied revision received on Subscribe streams (asked for while a drain waits)."}),
		AckRequests:        prometheus.NewCounter(prometheus.CounterOpts{Name: "registry_ack_requests_total", Help: "Requests to acknowledge a revision sent on Subscribe streams (one per follower of a service a drain waits for)."}),
		ResetsSent:         prometheus.NewCounterVec(prometheus.CounterOpts{Name: "registry_resets_sent_total", Help: "Reset snapshots sent to subscribers, by reason (ring, slow-subscriber, new-epoch; a relist of the same etcd history sends the differences, not resets)."}, []string{"reason"}),
		WatchRestarts:      prometheus.NewCounterVec(prometheus.CounterOpts{Name: "registry_etcd_watch_restarts_total", Help: "Times this regnode's etcd watch was re-established, by reason."}, []string{"reason"}),
		StaleBatches:       prometheus.NewCounter(prometheus.CounterOpts{Name: "registry_stale_batches_total", Help: "Batches refused by a cache because they were older than it."}),
		Probes:             prometheus.NewCounterVec(prometheus.CounterOpts{Name: "registry_probes_total", Help: "Health probes run by this regnode itself (of its share), by result."}, []string{"result"}),
		ProbeSeconds:       prometheus.NewHistogram(prometheus.HistogramOpts{Name: "registry_probe_seconds", Help: "Latency of health probes.", Buckets: prometheus.ExponentialBuckets(0.0001, 2, 16)}),
		Transitions:        prometheus.NewCounterVec(prometheus.CounterOpts{Name: "registry_health_transitions_total", Help: "Health transitions written, by from and to state."}, []string{"from", "to"}),
		FenceRejections:    prometheus.NewCounter(prometheus.CounterOpts{Name: "registry_fence_rejections_total", Help: "Health writes refused by their fence: the membership moved since this regnode's share was decided (or, for a leader's writes, it no longer led)."}),
		LeaderChanges:      prometheus.NewCounter(prometheus.CounterOpts{Name: "registry_leader_changes_total", Help: "Times this regnode started or stopped leading the prober."}),
		Leading:            prometheus.NewGauge(prometheus.GaugeOpts{Name: "registry_prober_leader", Help: "1 while this regnode leads the prober."}),
		Requests:           prometheus.NewCounterVec(prometheus.CounterOpts{Name: "registry_requests_total", Help: "API calls, by method and gRPC code."}, []string{"method", "code"}),
		RequestSeconds:     prometheus.NewHistogramVec(prometheus.HistogramOpts{Name: "registry_request_seconds", Help: "Latency of unary API calls.", Buckets: prometheus.ExponentialBuckets(0.0005, 2, 14)}, []string{"method"}),
		Limited:            prometheus.NewCounterVec(prometheus.CounterOpts{Name: "registry_limited_total", Help: "Calls refused with ResourceExhausted by a per-peer limit, by limit (write_rate, keepalive_rate, streams)."}, []string{"limit"}),
		NotOwner:           prometheus.NewCounterVec(prometheus.CounterOpts{Name: "registry_not_owner_total", Help: "KeepAlive and Deregister calls refused with PermissionDenied: no or another registration secret, by method."}, []string{"method"}),
		DNSQueries:         prometheus.NewCounterVec(prometheus.CounterOpts{Name: "registry_dns_queries_total", Help: "DNS queries (--dns-listen), by result: answer, truncated, nodata, nxdomain, refused, servfail, formerr, notimp, badvers; malformed and ratelimited were dropped unanswered."}, []string{"result"}),
		ProbeOwned:         prometheus.NewGauge(prometheus.GaugeOpts{Name: "registry_probe_owned_instances", Help: "Checked instances in this regnode's share (it probes them and writes their health)."}),
		Disagreements:      prometheus.NewCounter(prometheus.CounterOpts{Name: "registry_probe_disagreements_total", Help: "Evictions this regnode's probes called for that another regnode's probe did not confirm (the instance stayed)."}),
		DemotionsHeld:      prometheus.NewCounterVec(prometheus.CounterOpts{Name: "registry_demotions_held_total", Help: "Demotions held back, by reason: canary (this regnode's own canaries failed), mass (the mass-demotion limit)."}, []string{"reason"}),
		Confirmations:      prometheus.NewCounterVec(prometheus.CounterOpts{Name: "registry_probe_confirmations_total", Help: "Evictions this regnode asked another regnode to confirm, by result: confirmed, disagreed, error."}, []string{"result"}),
		Reports:            prometheus.NewCounterVec(prometheus.CounterOpts{Name: "registry_reports_total", Help: "Callers' reports of their calls to instances, by result: accepted, limited (more than one per service per second from a stream), invalid, unused, forwarded (to the owner regnode), owned (aggregated here), discounted (the caller's calls failed everywhere)."}, []string{"result"}),
	}
	r.MustRegister(m.Reports, m.ProbeOwned, m.Disagreements, m.DemotionsHeld, m.Confirmations, m.Limited, m.NotOwner, m.Registrations, m.ReRegistrations, m.RegistrationErrors, m.KeepAlives, m.KeepAliveLost, m.KeepAliveFailures,
		m.KeepAliveStreams, m.JunkSkipped, m.LifecycleWrites, m.Deregistrations, m.Subscribers, m.Acks, m.AckRequests, m.ResetsSent, m.WatchRestarts, m.StaleBatches,
		m.Probes, m.ProbeSeconds, m.Transitions, m.FenceRejections, m.LeaderChanges, m.Leading, m.Requests, m.RequestSeconds, m.DNSQueries)
	return m
}

// UnaryInterceptor counts and times every unary call.
func (m *Metrics) UnaryInterceptor() grpc.UnaryServerInterceptor {
	return func(ctx context.Context, req any, info *grpc.UnaryServerInfo, h grpc.UnaryHandler) (any, error) {
		start := time.Now()
		resp, err := h(ctx, req)
		m.RequestSeconds.WithLabelValues(info.FullMethod).Observe(time.Since(start).Seconds())
		m.Requests.WithLabelValues(info.FullMethod, status.Code(err).String()).Inc()
		return resp, err
	}
}

// StreamInterceptor counts every stream when it ends.
func (m *Metrics) StreamInterceptor() grpc.StreamServerInterceptor {
	return func(srv any, ss grpc.ServerStream, info *grpc.StreamServerInfo, h grpc.StreamHandler) error {
		err := h(srv, ss)
		m.Requests.WithLabelValues(info.FullMethod, status.Code(err).String()).Inc()
		return err
	}
}
