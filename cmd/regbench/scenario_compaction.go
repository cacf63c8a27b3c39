package main

import (
	"context"
	"encoding/json"
	"fmt"
	"net/url"
	"sync"
	"sync/atomic"
	"time"

	clientv3 "go.etcd.io/etcd/client/v3"
	etcdresolver "go.etcd.io/etcd/client/v3/naming/resolver"
	"go.uber.org/zap/zapcore"
	"google.golang.org/grpc/resolver"

	"github.com/regcluster/registry/client"
	"github.com/regcluster/registry/internal/node"
)

// runCompaction: S subscribers (SDK, through a TCP proxy in front of the
// regnode) and S etcd naming resolvers (their etcd clients through a TCP
// proxy in front of etcd) are cut off; the registry churns (more changes
// than the regnode's ring holds) and etcd compacts; then the links heal.
// Measured: time from the heal until each view equals what etcd holds,
// within a bounded wait, and whether it ever does.
func runCompaction(ctx context.Context, e *env) (*Result, error) {
	cfg := e.cfg
	r := newResult("compaction", "subscribers cut off while the registry churns and etcd compacts, then reconnected: time from the heal to a view equal to etcd's; SDK subscribers vs etcd naming resolvers")
	S := cfg.compSubs
	r.param("subs", S)
	r.param("churn", cfg.compChurn)
	r.param("ring", cfg.compRing)
	r.param("wait_s", cfg.compWait.Seconds())
	r.param("instances", cfg.propInstances)
	r.param("per_client", cfg.perClient)
	const base = kindResolver
	cs := fmt.Sprintf("S=%d", S)

	e.progress.set("starting etcd, a regnode and proxies")
	etcd, err := startEtcd(ctx, e, false)
	if err != nil {
		return r, err
	}
	e.onClose(etcd.Close)
	n, err := startNode(ctx, e, []string{etcd.URL}, func(c *node.Config) { c.RingSize = cfg.compRing })
	if err != nil {
		return r, err
	}
	e.onClose(func() { n.Close() })
	cli, err := etcdClient(sideWriter, etcd.URL, nil)
	if err != nil {
		return r, err
	}
	e.onClose(func() { cli.Close() })
	regProxy, err := newProxy(n.Addr())
	if err != nil {
		return r, err
	}
	e.onClose(regProxy.Cut)
	etcdProxy, err := newProxy(etcd.URL[len("http://"):])
	if err != nil {
		return r, err
	}
	e.onClose(etcdProxy.Cut)

	service := "comp"
	p, err := makePlan(service, cfg.propInstances, cfg.compChurn, 7)
	if err != nil {
		return r, err
	}
	ns, err := newNamespaces(cli, service)
	if err != nil {
		return r, err
	}
	if err := ns.writeInitial(ctx, cli, p); err != nil {
		return r, err
	}
	clients := (S + cfg.perClient - 1) / cfg.perClient

	// ours: S subscriptions through the regnode's proxy.
	e.progress.set("%d subscriptions, %d resolvers", S, S)
	var (
		subs       []*client.Subscription
		backwards  atomic.Int64 // a revision that went down: must stay 0
		lastRev    = make([]int64, S)
		lastRevMu  sync.Mutex
		regClients []*client.Client
	)
	e.onClose(func() {
		for _, s := range subs {
			s.Close()
		}
		for _, c := range regClients {
			c.Close()
		}
	})
	for range clients {
		c, err := regClient(e, regProxy.Addr())
		if err != nil {
			return r, err
		}
		regClients = append(regClients, c)
	}
	for i := range S {
		var s *client.Subscription
		labeled(sideClient, func() {
			s, err = regClients[i/cfg.perClient].Subscribe(ctx, service, client.SubscribeOptions{OnChange: func(ch client.Change) {
				lastRevMu.Lock()
				if ch.Revision < lastRev[i] && !ch.NewEpoch {
					backwards.Add(1)
				}
				lastRev[i] = ch.Revision
				lastRevMu.Unlock()
			}})
		})
		if err != nil {
			return r, err
		}
		subs = append(subs, s)
	}
	for _, s := range subs {
		if err := s.WaitReady(ctx); err != nil {
			return r, err
		}
	}

	// etcd_resolver: S resolvers on clients of etcd's proxy. Their logs
	// are counted: etcd's endpoints watch logs "watch failed" when it
	// gives up.
	failed := newCountingCore("watch failed")
	closedCore := newCountingCore("watch closed")
	var ecs []*clientv3.Client
	var resolvers []resolver.Resolver
	e.onClose(func() {
		for _, r := range resolvers {
			r.Close()
		}
		for _, c := range ecs {
			c.Close()
		}
	})
	for range clients {
		c, err := etcdClient(sideClient, etcdProxy.URL(), zapcore.NewTee(failed, closedCore))
		if err != nil {
			return r, err
		}
		ecs = append(ecs, c)
	}
	var ccs []*recordingCC
	for i := range S {
		b, err := etcdresolver.NewBuilder(ecs[i/cfg.perClient])
		if err != nil {
			return r, err
		}
		cc := &recordingCC{obs: &observer{}}
		var res resolver.Resolver
		labeled(sideClient, func() {
			res, err = b.Build(resolver.Target{URL: url.URL{Scheme: "etcd", Path: "/" + ns.target}}, cc, resolver.BuildOptions{})
		})
		if err != nil {
			return r, err
		}
		resolvers = append(resolvers, res)
		ccs = append(ccs, cc)
	}
	if err := waitFor(ctx, 5*time.Millisecond, func() bool {
		for _, cc := range ccs {
			if cc.updates.Load() == 0 {
				return false
			}
		}
		return true
	}); err != nil {
		return r, fmt.Errorf("resolvers' first update: %w", err)
	}
	resetsBefore := 0
	for _, s := range subs {
		resetsBefore += s.Stats().Resets
	}

	// Cut, churn, compact, heal.
	regProxy.Cut()
	etcdProxy.Cut()
	cutAt := time.Now()
	for i := range p.ops {
		for _, which := range []string{"ours", "naming"} {
			var err error
			labeled(sideWriter, func() { _, err = ns.apply(ctx, cli, which, p, i) })
			if err != nil {
				return r, fmt.Errorf("churn %d: %w", i, err)
			}
		}
		if i%50 == 0 {
			e.progress.set("cut off: churn %d/%d", i, len(p.ops))
		}
	}
	st, err := cli.Get(ctx, "compact-probe")
	if err != nil {
		return r, err
	}
	compactRev := st.Header.Revision
	if _, err := cli.Compact(ctx, compactRev, clientv3.WithCompactPhysical()); err != nil {
		return r, fmt.Errorf("compact: %w", err)
	}
	// What every view must end up as: etcd's state now.
	wantOurs, wantNaming, err := etcdState(ctx, cli, ns, service)
	if err != nil {
		return r, err
	}
	e.progress.set("cut off for %.1fs; compacted at %d; healing", time.Since(cutAt).Seconds(), compactRev)
	if err := regProxy.Heal(); err != nil {
		return r, err
	}
	if err := etcdProxy.Heal(); err != nil {
		return r, err
	}
	healAt := time.Now()

	oursAt := make([]time.Duration, S)
	namingAt := make([]time.Duration, S)
	for i := range oursAt {
		oursAt[i], namingAt[i] = -1, -1
	}
	wctx, wcancel := context.WithTimeout(ctx, cfg.compWait)
	_ = waitFor(wctx, 5*time.Millisecond, func() bool {
		now := time.Since(healAt)
		done := 0
		for i, s := range subs {
			if oursAt[i] < 0 && sameOurs(s, service, wantOurs) {
				oursAt[i] = now
			}
			if namingAt[i] < 0 && sameNaming(ccs[i].current(), wantNaming) {
				namingAt[i] = now
			}
			if oursAt[i] >= 0 && namingAt[i] >= 0 {
				done++
			}
		}
		nOurs, nNaming := converged(oursAt), converged(namingAt)
		e.progress.set("healed %.1fs ago: ours %d/%d, etcd resolvers %d/%d converged", now.Seconds(), nOurs, S, nNaming, S)
		return done == S
	})
	wcancel()
	if ctx.Err() != nil {
		return r, ctx.Err()
	}
	waited := time.Since(healAt)
	resets := -resetsBefore
	for _, s := range subs {
		resets += s.Stats().Resets
	}
	staleOurs, staleNaming := 0, 0
	for i, s := range subs {
		if !sameOurs(s, service, wantOurs) {
			staleOurs++
		}
		if !sameNaming(ccs[i].current(), wantNaming) {
			staleNaming++
		}
	}
	r.ours(cs, "converge_ms", summarize(positive(oursAt)))
	r.ours(cs, "converged", converged(oursAt))
	r.ours(cs, "stale_at_end", staleOurs)
	r.ours(cs, "resets", resets)
	r.ours(cs, "revision_went_back", int(backwards.Load()))
	r.base(base, cs, "converge_ms", summarize(positive(namingAt)))
	r.base(base, cs, "converged", converged(namingAt))
	r.base(base, cs, "stale_at_end", staleNaming)
	r.base(base, cs, "watch_failed_logs", int(failed.n.Load()))
	r.skipRatio("stale_at_end", "resets", "revision_went_back", "watch_failed_logs")
	r.param("cut_s", round3(healAt.Sub(cutAt).Seconds()))
	r.param("compact_revision", compactRev)
	r.target(cs+" ours converged, state equal to etcd's", fmt.Sprintf("%d/%d within %s", S, S, cfg.compWait),
		fmt.Sprintf("%d/%d, stale at end %d, revision went back %d times", converged(oursAt), S, staleOurs, backwards.Load()),
		converged(oursAt) == S && staleOurs == 0 && backwards.Load() == 0)
	r.note("ours reconnects to the regnode and resumes from its revision; the churn (%d changes) exceeds the regnode's ring (%d events), so each subscriber is sent a reset snapshot (resets counts them)", cfg.compChurn, cfg.compRing)
	r.note("etcd_resolver: after the heal its clientv3 watch resumes at a compacted revision; naming/endpoints logs \"watch failed\" (%d times here, %d \"watch closed\") and closes its channel, and the resolver never updates again: %d/%d resolvers still stale after waiting %.1fs (the bound)",
		failed.n.Load(), closedCore.n.Load(), staleNaming, S, waited.Seconds())
	r.note("converge time is from the heal, so it includes gRPC's reconnect backoff (default: 1s base, x1.6) and the SDK's resubscribe backoff (50ms..2s, jittered), both grown during the cut")
	return r, nil
}

func converged(ds []time.Duration) int {
	n := 0
	for _, d := range ds {
		if d >= 0 {
			n++
		}
	}
	return n
}

func positive(ds []time.Duration) []time.Duration {
	var out []time.Duration
	for _, d := range ds {
		if d >= 0 {
			out = append(out, d)
		}
	}
	return out
}

// etcdState reads what the views must equal: instance id → mod revision
// for ours, the set of endpoint addresses for the naming target.
func etcdState(ctx context.Context, cli *clientv3.Client, ns *namespaces, service string) (map[string]int64, map[string]bool, error) {
	resp, err := cli.Get(ctx, ns.ours.Service(service), clientv3.WithPrefix())
	if err != nil {
		return nil, nil, err
	}
	ours := map[string]int64{}
	for _, kv := range resp.Kvs {
		_, id, ok := ns.ours.Parse(string(kv.Key))
		if ok {
			ours[id] = kv.ModRevision
		}
	}
	resp, err = cli.Get(ctx, ns.target+"/", clientv3.WithPrefix())
	if err != nil {
		return nil, nil, err
	}
	naming := map[string]bool{}
	for _, kv := range resp.Kvs {
		var ep struct{ Addr string }
		if err := json.Unmarshal(kv.Value, &ep); err == nil {
			naming[ep.Addr] = true
		}
	}
	return ours, naming, nil
}

func sameOurs(s *client.Subscription, service string, want map[string]int64) bool {
	got := s.Instances(service)
	if len(got) != len(want) {
		return false
	}
	for _, in := range got {
		if want[in.Id] != in.ModRevision {
			return false
		}
	}
	return true
}

func sameNaming(got, want map[string]bool) bool {
	if len(got) != len(want) {
		return false
	}
	for a := range want {
		if !got[a] {
			return false
		}
	}
	return true
}
