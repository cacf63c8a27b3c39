package node

import (
	"context"
	"sync"
	"time"

	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/metadata"
	"google.golang.org/grpc/status"

	"github.com/regcluster/registry/internal/reports"
	"github.com/regcluster/registry/internal/server"
	registryv1 "github.com/regcluster/registry/proto/registry/v1"
)

// Callers' reports (health at scale): a regnode takes SDK clients'
// reports of their calls on their Subscribe streams, keeps those about
// the instances it owns (package reports) and forwards the others to
// their owners (ForwardReports), so that the owner counts every caller,
// whichever regnode each talks to. An instance that several callers see
// failing is probed at once (prober.Nudge); the prober decides.

// forwardsInFlight bounds the ForwardReports calls in flight; past it a
// report for another regnode is dropped (and counted): reports are
// advisory, and a regnode must not queue without bound behind a slow
// peer.
const forwardsInFlight = 16

// reporting is a regnode's part of callers' reports.
type reporting struct {
	n   *Node
	agg *reports.Aggregator

	slots chan struct{}
	wg    sync.WaitGroup
	ctx   context.Context
	stop  context.CancelFunc
}

func newReporting(n *Node, window time.Duration) (*reporting, error) {
	agg, err := reports.New(reports.Config{Window: window})
	if err != nil {
		return nil, err
	}
	ctx, cancel := context.WithCancel(context.Background())
	return &reporting{n: n, agg: agg, slots: make(chan struct{}, forwardsInFlight), ctx: ctx, stop: cancel}, nil
}

// close stops forwarding and waits for the calls in flight.
func (r *reporting) close() {
	r.stop()
	r.wg.Wait()
}

// take handles one report: its instances this regnode owns are counted
// here, the others forwarded to their owners.
func (r *reporting) take(reporter string, rep *registryv1.SubscribeReport) {
	s := r.n.shards
	v, _ := s.members.View()
	if v == nil || v.Self < 0 {
		r.own(reporter, rep)
		return
	}
	// The whole report goes to each owner: whether a caller's calls to
	// an instance's peers succeed is read from all of it.
	owners := map[string]bool{}
	for _, c := range rep.Instances {
		if o, ok := v.Owner(rep.Service, c.Id); ok {
			owners[o.Key] = true
		}
	}
	for addr := range owners {
		if addr == s.self {
			r.own(reporter, rep)
			continue
		}
		r.forward(addr, reporter, rep)
	}
}

// own counts a report here and nudges the prober for every instance it
// raised to the quorum or past it.
func (r *reporting) own(reporter string, rep *registryv1.SubscribeReport) {
	m := r.n.metrics
	calls := make([]reports.Calls, len(rep.Instances))
	for i, c := range rep.Instances {
		calls[i] = reports.Calls{ID: c.Id, Failures: c.Failures, Successes: c.Successes, Ejected: c.Ejected}
	}
	now := time.Now()
	raised, discounted := r.agg.Add(reporter, rep.Service, calls, now)
	if discounted {
		m.Reports.WithLabelValues("discounted").Inc()
		return
	}
	for _, id := range raised {
		if r.agg.Failing(rep.Service, id, now) >= r.n.cfg.ReportQuorum {
			r.n.prober.Nudge(rep.Service, id)
		}
	}
	m.Reports.WithLabelValues("owned").Inc()
}

// forward sends rep to the owner at addr, in the background, if a slot
// is free.
func (r *reporting) forward(addr, reporter string, rep *registryv1.SubscribeReport) {
	select {
	case r.slots <- struct{}{}:
	default:
		r.n.metrics.Reports.WithLabelValues("dropped").Inc()
		return
	}
	r.wg.Add(1)
	go func() {
		defer r.wg.Done()
		defer func() { <-r.slots }()
		cli, err := r.n.shards.conn(addr)
		if err == nil {
			ctx, cancel := context.WithTimeout(r.ctx, 5*time.Second)
			ctx = metadata.AppendToOutgoingContext(ctx, server.PeerHeader, r.n.peerSecret)
			_, err = cli.ForwardReports(ctx, &registryv1.ForwardReportsRequest{Reports: []*registryv1.ForwardedReport{{Reporter: reporter, Report: rep}}})
			cancel()
		}
		if err != nil {
			r.n.metrics.Reports.WithLabelValues("dropped").Inc()
			if r.ctx.Err() == nil {
				r.n.log.Debug("forward a caller's report", "to", addr, "err", err)
			}
			return
		}
		r.n.metrics.Reports.WithLabelValues("forwarded").Inc()
	}()
}

// forwarded serves ForwardReports: another regnode's, checked by the
// peer secret.
func (r *reporting) forwarded(ctx context.Context, req *registryv1.ForwardReportsRequest) error {
	if !server.FromPeer(ctx, r.n.peerSecret) {
		return status.Error(codes.PermissionDenied, "ForwardReports is for regnodes only (no or a wrong peer secret)")
	}
	for _, f := range req.Reports {
		rep := f.GetReport()
		if rep == nil || len(rep.Instances) > server.MaxReportInstances {
			return status.Errorf(codes.InvalidArgument, "reports: a report of at most %d instances is required", server.MaxReportInstances)
		}
		r.own(f.Reporter, rep)
	}
	return nil
}

// failing is how many callers see service/id failing now (the prober's
// Config.Reported).
func (r *reporting) failing(service, id string) int {
	return r.agg.Failing(service, id, time.Now())
}
