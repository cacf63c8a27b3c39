package client

import (
	"cmp"
	"context"
	"slices"
	"time"

	"github.com/regcluster/registry/balance"
	registryv1 "github.com/regcluster/registry/proto/registry/v1"
)

// maxReportInstances is the most instances a regnode takes in one report
// (the registry's MaxReportInstances).
const maxReportInstances = 1024

// DefaultReportInterval is Config.ReportInterval's default: often enough
// for the registry to see within seconds an instance that fails its
// callers, rarely enough to cost a regnode one small message per followed
// service every few seconds per client.
const DefaultReportInterval = 5 * time.Second

// reportLoop sends, every ReportInterval until ctx ends, what the
// Client's channels' calls saw of each instance since the last report, on
// the Subscribe stream mc (through its sender, so it never waits on the
// network here): one SubscribeReport per service the stream follows, at
// most maxReportInstances instances each (the most failing first).
// What is not sent (a service not followed, past the bound) is dropped:
// reports are advisory.
func (m *mux) reportLoop(ctx context.Context, mc *muxConn) {
	every := m.c.reportInterval
	if every < 0 {
		return
	}
	t := time.NewTicker(every)
	defer t.Stop()
	m.c.metrics.TakeCalls() // what came before this stream is stale
	for {
		select {
		case <-ctx.Done():
			return
		case <-t.C:
		}
		for svc, calls := range m.c.metrics.TakeCalls() {
			if m.feedOf(svc) == nil {
				continue
			}
			if len(calls) > maxReportInstances {
				slices.SortFunc(calls, func(a, b balance.InstanceCalls) int { return cmp.Compare(b.Failures, a.Failures) })
				calls = calls[:maxReportInstances]
			}
			r := &registryv1.SubscribeReport{Service: svc, Instances: make([]*registryv1.InstanceCalls, len(calls))}
			for i, c := range calls {
				r.Instances[i] = &registryv1.InstanceCalls{Id: c.ID, Failures: c.Failures, Successes: c.Successes, Ejected: c.Ejected}
			}
			mc.queue(&registryv1.SubscribeRequest{Kind: &registryv1.SubscribeRequest_Report{Report: r}})
		}
	}
}
