package node

import (
	"context"
	"strings"
	"time"

	"github.com/regcluster/registry/election"
	"github.com/regcluster/registry/health"
	"github.com/regcluster/registry/internal/stopper"
	"github.com/regcluster/registry/probe"
	"github.com/regcluster/registry/prober"
	registryv1 "github.com/regcluster/registry/proto/registry/v1"
	"github.com/regcluster/registry/store"
)

// startProber makes the probe checker and the prober (sharding.go runs
// its probing once this regnode is announced), and runs the prober
// election, whose leader sweeps orphaned saved states. The election is
// quiesced when the regnode stops: it resigns at once, so another
// regnode takes the sweep over while this one drains; the checker closes
// once the election and the prober have returned.
func (n *Node) startProber(ctx context.Context, cfg Config, st *store.Store) error {
	m := n.metrics
	var err error
	if n.reports, err = newReporting(n, cfg.ReportWindow); err != nil {
		return err
	}
	if err := n.life.Start(ctx, stopper.Component{Name: "callers' reports",
		Close: func() error { n.reports.close(); return nil }}); err != nil {
		return err
	}
	// Probes say who sends them: User-Agent "regnode/<Version> (<name>)".
	// Version, not buildinfo's: it is what Status reports, and a build
	// from a checkout has buildinfo version "(devel)".
	if n.probe, err = probe.New(probe.Config{DefaultTimeout: cfg.ProbeTimeout, Logger: n.log,
		Agent: probe.Agent{Version: Version, Node: cfg.Name}}); err != nil {
		return err
	}
	if err := n.life.Start(ctx, stopper.Component{Name: "probe checker",
		Close: func() error { n.probe.Close(); return nil }}); err != nil {
		return err
	}
	pr, err := prober.New(prober.Config{Store: st, View: n.hub.Cache().Snapshot, Probe: n.probe,
		Thresholds: cfg.Thresholds, Interval: cfg.ProbeInterval, Concurrency: cfg.ProbeConcurrency,
		Node: cfg.Name, Logger: n.log, MassShare: cfg.MassDemotionShare,
		MassWindow: cfg.MassDemotionWindow, MassTrickle: cfg.MassDemotionWindow / 6,
		Confirm: func(ctx context.Context, in *registryv1.Instance) (prober.Verdict, error) {
			return n.shards.confirm(ctx, in)
		},
		Canary:   func() string { return n.shards.Canary() },
		OnOwned:  func(k int) { m.ProbeOwned.Set(float64(k)) },
		Reported: n.reports.failing, ReportQuorum: cfg.ReportQuorum,
		OnDisagreement: m.Disagreements.Inc,
		OnHeld:         func(kind string) { m.DemotionsHeld.WithLabelValues(kind).Inc() },
		OnProbe: func(o health.Outcome, d time.Duration) {
			m.Probes.WithLabelValues(strings.ToLower(o.String())).Inc()
			m.ProbeSeconds.Observe(d.Seconds())
		},
		OnTransition: func(tr health.Transition) {
			m.Transitions.WithLabelValues(view(tr.From), view(tr.To)).Inc()
		},
		OnFenced: m.FenceRejections.Inc,
	})
	if err != nil {
		return err
	}
	n.prober = pr
	el, err := election.New(election.Config{Client: n.cli, Prefix: cfg.Prefix, Name: cfg.Name,
		SessionTTL: cfg.SessionTTL, Logger: n.log,
		OnLeaderChange: func(leading bool) {
			m.LeaderChanges.Inc()
			if leading {
				m.Leading.Set(1)
			} else {
				m.Leading.Set(0)
			}
		}})
	if err != nil {
		return err
	}
	return n.life.Start(ctx, stopper.Component{Name: "prober election", Quiesce: true,
		Run: func(ctx context.Context) error {
			select { // probe from a filled view
			case <-n.hub.Ready():
			case <-ctx.Done():
				return nil
			}
			return el.Run(ctx, pr.Sweep) // ends only with ctx
		}})
}

func view(s registryv1.HealthState) string {
	return strings.TrimPrefix(s.String(), "HEALTH_STATE_")
}

// leader names the prober leader for Status ("" if none or unknown).
func (n *Node) leader(ctx context.Context) string {
	l, err := election.CurrentLeader(ctx, n.cli, n.cfg.Prefix)
	if err != nil {
		return ""
	}
	return l.Name
}
