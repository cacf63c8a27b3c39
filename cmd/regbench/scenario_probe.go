package main

import (
	"context"
	"fmt"
	"io"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"runtime"
	"slices"
	"sync"
	"time"

	clientv3 "go.etcd.io/etcd/client/v3"
	"google.golang.org/protobuf/types/known/durationpb"
	"google.golang.org/protobuf/types/known/timestamppb"

	registryv1 "github.com/regcluster/registry/proto/registry/v1"
	"github.com/regcluster/registry/record"
)

// The probe scenario's checks: TCP, every second; an instance is on time
// in a window when no two of its probes (the window's ends counting as
// probes) are further apart than probeLate; a side keeps N on time when at
// least probeOnTime of them are.
const (
	probeInterval = time.Second
	probeLate     = probeInterval * 3 / 2
	probeOnTime   = 0.95
	probeSvcSize  = 100 // instances per service
	probeVictims  = 2   // listeners [0, 2): one killed per side; instances use the rest
)

// probeSide is one of the scenario's two sides.
type probeSide struct {
	name string   // the case's side in the result: "" for ours, else the baseline's name
	cpus []string // one regnode per entry, pinned there ("": unpinned)
}

// probeStep is what one window measured at N instances.
type probeStep struct {
	n           int
	rate        float64 // probes per second (the regnodes' counters)
	accepts     float64 // connections per second the timed targets accepted
	timed       int     // instances whose listener is timed (the sample)
	seenRate    float64 // probes per second the timed targets saw, scaled to all n
	failed      float64 // probes in the window whose result was not ok
	onTime      float64 // share of instances whose longest gap was within probeLate
	rateShare   float64 // min(1, rate / (n/interval)): what the counters alone would say
	never       int     // instances not probed at all in the window
	gaps        Lat     // the instances' longest gaps
	regnodeCPU  float64 // cores the regnodes used (CPU-seconds per second)
	userShare   float64 // of that, the share in user space (the rest: the kernel, both ends of loopback TCP)
	perCPU      float64 // probes per regnode CPU-second
	targetCPU   float64 // cores the target processes used
	benchCPU    float64 // cores this process used: etcd, the writer, the polls
	transitions float64 // health transitions written in the window
	pass        bool
}

// probeOutcome is one side's figures.
type probeOutcome struct {
	steps        []probeStep
	best         int // the largest N kept on time (0: none)
	capped       bool
	detectDeg    time.Duration
	detectUnav   time.Duration
	detectFailed string
}

// runProbe: checked instances (TCP, 1 s) probed by one regnode pinned to
// one core, then by two regnodes each pinned to its own core, each side
// on a fresh etcd (embedded in this process) and the same targets (a
// child process, pinned nowhere). Per side it steps N up, doubling, then
// bisecting, until fewer than 95% of the instances are on time; each
// step measures the probe rate, the share on time (from the targets' own
// accept times), probes per regnode CPU-second, and where the rest of
// the CPU went. Then, at the largest N kept on time, one backend is
// killed and the time until etcd holds it DEGRADED, then UNAVAILABLE, is
// measured.
func runProbe(ctx context.Context, e *env) (*Result, error) {
	cfg := e.cfg
	r := newResult("probe", "TCP checks every 1s: two regnodes, each pinned to its own core (ours), against one pinned to one core; etcd and the targets share the cores")
	r.param("check_interval_s", probeInterval.Seconds())
	r.param("late_after_s", probeLate.Seconds())
	r.param("start", cfg.probeStart)
	r.param("max", cfg.probeMax)
	r.param("bisect", cfg.probeBisect)
	r.param("window_s", cfg.probeWindow.Seconds())
	r.param("warmup_s", cfg.probeWarmup.Seconds())
	r.param("timed_every", cfg.probeTimedEvery)
	r.skipRatio("instances", "never_probed", "transitions", "max_on_time_instances_capped", "timed_instances", "failed_probes")

	cpus := [2]string{"0", "1"}
	switch _, err := exec.LookPath("taskset"); {
	case err != nil:
		cpus = [2]string{"", ""}
		r.note("taskset not found: the regnodes run unpinned")
	case runtime.NumCPU() < 2:
		cpus = [2]string{"0", "0"}
		r.note("one CPU: both regnodes are pinned to it")
	}
	sides := []probeSide{{name: "one_regnode", cpus: cpus[:1]}, {name: "", cpus: cpus[:]}}

	dir, bin, err := regnodeBinary(ctx, e, "regbench-probe-")
	if err != nil {
		return r, err
	}
	tg := newTargetPool(ctx, cfg.probeTimedEvery)
	e.onClose(tg.close)

	start := time.Now()
	deadline, ok := ctx.Deadline()
	if !ok {
		deadline = start.Add(10 * time.Minute)
	}
	out := map[string]*probeOutcome{}
	for i, s := range sides {
		// Each side gets an equal part of what is left.
		sideEnd := time.Now().Add(time.Until(deadline) / time.Duration(len(sides)-i))
		o, err := probeOneSide(ctx, e, bin, dir, tg, s, i, sideEnd)
		if err != nil {
			return r, fmt.Errorf("%d regnode(s): %w", len(s.cpus), err)
		}
		out[s.name] = o
		record := func(c, metric string, v any) {
			if s.name == "" {
				r.ours(c, metric, v)
			} else {
				r.base(s.name, c, metric, v)
			}
		}
		for _, st := range sortedSteps(o) {
			c := fmt.Sprintf("N=%d", st.n)
			record(c, "probes_per_s", round3(st.rate))
			record(c, "on_time_share", round3(st.onTime))
			record(c, "rate_share", round3(st.rateShare))
			record(c, "never_probed", st.never)
			record(c, "longest_gap_ms", st.gaps)
			record(c, "probes_per_cpu_s", round3(st.perCPU))
			record(c, "regnode_cores", round3(st.regnodeCPU))
			record(c, "regnode_user_share", round3(st.userShare))
			record(c, "target_cores", round3(st.targetCPU))
			record(c, "etcd_and_bench_cores", round3(st.benchCPU))
			record(c, "target_accepts_per_s", round3(st.accepts))
			record(c, "timed_instances", st.timed)
			record(c, "probes_per_s_seen_by_targets", round3(st.seenRate))
			record(c, "failed_probes", st.failed)
			record(c, "transitions", st.transitions)
		}
		sat := o.saturated()
		record("capacity", "max_on_time_instances", o.best)
		record("capacity", "max_on_time_instances_capped", o.capped)
		record("capacity", "probes_per_s", round3(sat.rate))
		record("capacity", "probes_per_cpu_s", round3(sat.perCPU))
		record("capacity", "regnode_cores", round3(sat.regnodeCPU))
		if o.detectFailed == "" {
			record("capacity", "detect_degraded_ms", ms(o.detectDeg))
			record("capacity", "detect_unavailable_ms", ms(o.detectUnav))
		} else {
			r.note("%d regnode(s): detection: %s", len(s.cpus), o.detectFailed)
		}
		if o.capped {
			r.note("%d regnode(s) kept every step on time up to -probe-max %d: its capacity is higher", len(s.cpus), cfg.probeMax)
		}
	}
	one, two := out["one_regnode"], out[""]
	r1, r2 := one.saturated().rate, two.saturated().rate
	var q float64
	if r1 > 0 {
		q = round3(r2 / r1)
	}
	r.Ratio.set("rate_2_vs_1", q)
	r.target("rate_2_vs_1: probe rate of two regnodes over one, each at its most", ">= 1.8", fmt.Sprintf("%.3f", q), q >= 1.8)
	took := time.Since(start)
	if !cfg.short {
		r.target("the default run ends within 10 minutes", "<= 600s", fmt.Sprintf("%.0fs", took.Seconds()), took <= 10*time.Minute)
	}
	r.note("probes_per_s at capacity is the highest rate of any step (a step past the side's capacity measures it); on time: no gap over %s between two probes of an instance, timed by the targets' accepts", probeLate)
	r.note("targets: one listener in %d accepts and times its probes (timed_instances, a uniform sample: owners are a hash of the instance's name); the rest defer accept (TCP_DEFER_ACCEPT): the prober's connect succeeds and its reset drops the embryonic connection, so they cost the targets no system call; probes_per_s_seen_by_targets scales the sample's accepts to every instance", cfg.probeTimedEvery)
	r.note("cores: CPU-seconds per second; regnode_user_share is user time over user+system (on loopback the kernel work of both ends of a probe's handshake runs in the prober's system calls); etcd_and_bench_cores is this process: etcd, the writer, the polls")
	return r, nil
}

// saturated is the step with the highest probe rate.
func (o *probeOutcome) saturated() probeStep {
	var s probeStep
	for _, st := range o.steps {
		if st.rate > s.rate {
			s = st
		}
	}
	return s
}

// probeRig is one side's running parts.
type probeRig struct {
	e     *env
	cli   *clientv3.Client
	keys  record.Keys
	lease clientv3.LeaseID
	tg    *targetPool
	nodes []*regnodeProc
	cur   int // instances registered
}

// probeOneSide runs one side on a fresh etcd and fresh regnodes; it starts
// no new step that would end past end.
func probeOneSide(ctx context.Context, e *env, bin, dir string, tg *targetPool, s probeSide, idx int, end time.Time) (*probeOutcome, error) {
	cfg := e.cfg
	label := fmt.Sprintf("%d regnode(s)", len(s.cpus))
	e.progress.set("%s: starting etcd", label)
	etcd, err := startEtcd(ctx, e, false)
	if err != nil {
		return nil, err
	}
	defer etcd.Close()
	cli, err := etcdClient(sideWriter, etcd.URL, nil)
	if err != nil {
		return nil, err
	}
	defer cli.Close()
	// One lease for every instance, long enough never to need renewing.
	lease, err := cli.Grant(ctx, int64(time.Hour/time.Second))
	if err != nil {
		return nil, err
	}
	rig := &probeRig{e: e, cli: cli, keys: record.NewKeys(""), lease: lease.ID, tg: tg}
	defer func() {
		for _, p := range rig.nodes {
			p.kill()
		}
	}()
	for i, c := range s.cpus {
		p, err := startRegnodeProcOn(bin, fmt.Sprintf("side%d-rn%d", idx+1, i+1), etcd.URL, filepath.Join(dir, fmt.Sprint(idx)), c,
			"--probe-interval", probeInterval.String())
		if err != nil {
			return nil, err
		}
		rig.nodes = append(rig.nodes, p)
	}
	for _, p := range rig.nodes {
		if err := p.waitServing(ctx); err != nil {
			return nil, err
		}
	}
	// Every regnode sees every other before any instance exists, so no
	// share moves while measuring.
	e.progress.set("%s: waiting for the membership", label)
	if err := waitFor(ctx, 50*time.Millisecond, func() bool { return rig.members() == len(rig.nodes) }); err != nil {
		return nil, fmt.Errorf("regnodes do not see each other: %w", err)
	}

	o := &probeOutcome{}
	n, lo, hi, bisected := cfg.probeStart, 0, 0, 0
	var lastTook time.Duration
	for {
		if time.Now().Add(lastTook + 30*time.Second).After(end) {
			e.progress.set("%s: stepping stopped at N=%d: the time of this side is up", label, n)
			break
		}
		t0 := time.Now()
		st, err := rig.step(ctx, n, fmt.Sprintf("%s-%d", label[:1], n))
		if err != nil {
			return nil, err
		}
		lastTook = time.Since(t0)
		o.steps = append(o.steps, st)
		if st.pass {
			lo = n
		} else {
			hi = n
		}
		switch {
		case hi == 0 && n >= cfg.probeMax:
			o.capped = true
		case hi == 0:
			n = min(2*n, cfg.probeMax)
			continue
		case lo == 0 && n/2 >= 1:
			n /= 2 // not even the first step: halve until one passes
			continue
		case lo > 0 && bisected < cfg.probeBisect && hi-lo > 1:
			bisected++
			n = (lo + hi) / 2
			continue
		}
		break
	}
	o.best = lo

	// Detection at the largest N kept on time.
	if lo > 0 {
		if err := rig.setInstances(ctx, lo); err != nil {
			return nil, err
		}
		if err := rig.waitOwned(ctx, lo); err != nil {
			return nil, err
		}
	}
	e.progress.set("%s: a backend killed at N=%d", label, lo)
	o.detectDeg, o.detectUnav, err = rig.detect(ctx, idx)
	if err != nil {
		if ctx.Err() != nil {
			return nil, err
		}
		o.detectFailed = err.Error()
	}
	return o, nil
}

// members is the smallest membership any regnode reports.
func (g *probeRig) members() int {
	least := -1
	for _, p := range g.nodes {
		ctx, cancel := context.WithTimeout(context.Background(), time.Second)
		resp, err := p.reg.Status(ctx, &registryv1.StatusRequest{})
		cancel()
		if err != nil {
			return 0
		}
		if m := int(resp.GetProbing().GetMembers()); least < 0 || m < least {
			least = m
		}
	}
	return least
}

// sum adds metric families over the regnodes, each regnode's read from
// one scrape (-1 if one cannot be read).
func (g *probeRig) sum(ctx context.Context, names ...string) []float64 {
	total := make([]float64, len(names))
	for _, p := range g.nodes {
		for i, v := range p.scrape(ctx, names...) {
			if v < 0 || total[i] < 0 {
				total[i] = -1
				continue
			}
			total[i] += v
		}
	}
	return total
}

// owned is the instances the regnodes' probers own, from Status: the
// gauge registry_probe_owned_instances moves only when the share does,
// not when instances come and go.
func (g *probeRig) owned(ctx context.Context) int64 {
	var total int64
	for _, p := range g.nodes {
		resp, err := p.reg.Status(ctx, &registryv1.StatusRequest{})
		if err != nil {
			return -1
		}
		total += resp.GetProbing().GetOwned()
	}
	return total
}

func (g *probeRig) waitOwned(ctx context.Context, n int) error {
	err := waitFor(ctx, 100*time.Millisecond, func() bool { return g.owned(ctx) == int64(n) })
	if err != nil {
		err = fmt.Errorf("the regnodes own %v instances, want %d: %w", g.owned(context.WithoutCancel(ctx)), n, err)
		for _, p := range g.nodes {
			err = fmt.Errorf("%w\n%s's stderr ends:\n%s", err, p.name, p.tail())
		}
		return err
	}
	return nil
}

// probeInstance is checked instance i. It is stored HEALTHY, as a
// registry's instances are in its steady state: its owner's first probe
// finds nothing to write, and its first probes are spread over an
// interval. Stored UNKNOWN, thousands of first verdicts landed in a step's
// window past a side's capacity (they come only as fast as the probes),
// and their writes took CPU from the probing being measured.
func probeInstance(i int, addr string, lease clientv3.LeaseID) *registryv1.Instance {
	return &registryv1.Instance{Service: fmt.Sprintf("probe-%03d", i/probeSvcSize), Id: fmt.Sprintf("t%06d", i), Address: addr,
		Lifecycle: registryv1.Lifecycle_LIFECYCLE_SERVING, LeaseId: int64(lease), RegisteredAt: timestamppb.Now(),
		Check:  &registryv1.HealthCheck{Kind: registryv1.CheckKind_CHECK_KIND_TCP, Interval: durationpb.New(probeInterval)},
		Health: &registryv1.Health{State: registryv1.HealthState_HEALTH_STATE_HEALTHY, Since: timestamppb.Now(), Reason: "stored by regbench"}}
}

// setInstances registers or deletes instances until there are n. New
// ones are written over at least one interval, so that their first
// probes (at once on arrival) and so their phases are spread.
func (g *probeRig) setInstances(ctx context.Context, n int) error {
	const batch = 128
	if err := g.tg.grow(probeVictims + n); err != nil {
		return err
	}
	if n < g.cur {
		for from := n; from < g.cur; from += batch {
			var ops []clientv3.Op
			for i := from; i < min(from+batch, g.cur); i++ {
				in := probeInstance(i, "", 0)
				ops = append(ops, clientv3.OpDelete(g.keys.Instance(in.Service, in.Id)))
			}
			if _, err := g.cli.Txn(ctx).Then(ops...).Commit(); err != nil {
				return err
			}
		}
		g.cur = n
		return nil
	}
	batches := (n - g.cur + batch - 1) / batch
	pace := time.NewTicker(max(time.Millisecond, probeInterval/time.Duration(max(1, batches))))
	defer pace.Stop()
	for g.cur < n {
		var ops []clientv3.Op
		for i := g.cur; i < min(g.cur+batch, n); i++ {
			in := probeInstance(i, g.tg.addrs[probeVictims+i], g.lease)
			v, err := record.Encode(in)
			if err != nil {
				return err
			}
			ops = append(ops, clientv3.OpPut(g.keys.Instance(in.Service, in.Id), string(v), clientv3.WithLease(g.lease)))
		}
		if _, err := g.cli.Txn(ctx).Then(ops...).Commit(); err != nil {
			return err
		}
		g.cur += len(ops)
		select {
		case <-pace.C:
		case <-ctx.Done():
			return ctx.Err()
		}
	}
	return nil
}

// cpuSnap is the CPU time of every process of a side at one moment.
type cpuSnap struct {
	at             time.Time
	user, sys      time.Duration // the regnodes'
	targets, bench time.Duration
	probes, ok     float64
	trans          float64
}

func (g *probeRig) snap(ctx context.Context) cpuSnap {
	m := g.sum(ctx, "registry_probes_total", `registry_probes_total{result="ok"}`, "registry_health_transitions_total")
	s := cpuSnap{at: time.Now(), targets: g.tg.cpu(), bench: cpuTime(), probes: m[0], ok: m[1], trans: m[2]}
	for _, p := range g.nodes {
		u, sy := procTimes(p.cmd.Process.Pid)
		s.user += u
		s.sys += sy
	}
	return s
}

// step sets N instances, lets their probes settle, and measures one
// window.
func (g *probeRig) step(ctx context.Context, n int, tag string) (probeStep, error) {
	cfg := g.e.cfg
	g.e.progress.set("%s: N=%d: registering", tag, n)
	if err := g.setInstances(ctx, n); err != nil {
		return probeStep{}, err
	}
	if err := g.waitOwned(ctx, n); err != nil {
		return probeStep{}, err
	}
	g.e.progress.set("%s: N=%d: warming up", tag, n)
	sleep(ctx, cfg.probeWarmup)
	g.e.progress.set("%s: N=%d: measuring for %s", tag, n, cfg.probeWindow)
	if err := g.tg.start(probeVictims + n); err != nil {
		return probeStep{}, err
	}
	a := g.snap(ctx)
	var wg sync.WaitGroup
	if cfg.probeProfile != "" {
		for _, p := range g.nodes {
			wg.Go(func() { g.profile(ctx, p, fmt.Sprintf("%s-%s-N%d.pprof", cfg.probeProfile, p.name, n)) })
		}
	}
	sleep(ctx, cfg.probeWindow)
	accepts, gaps, err := g.tg.stop()
	b := g.snap(ctx)
	wg.Wait()
	if err != nil {
		return probeStep{}, err
	}
	if ctx.Err() != nil {
		return probeStep{}, ctx.Err()
	}
	dt := b.at.Sub(a.at).Seconds()
	st := probeStep{n: n, rate: (b.probes - a.probes) / dt, accepts: float64(accepts) / dt, transitions: b.trans - a.trans,
		failed: (b.probes - a.probes) - (b.ok - a.ok)}
	var ds []time.Duration
	onTime := 0
	for _, gap := range gaps[min(probeVictims, len(gaps)):] {
		if gap < 0 {
			continue // killed, or not timed
		}
		ds = append(ds, gap)
		if gap <= probeLate {
			onTime++
		}
		if gap >= cfg.probeWindow {
			st.never++
		}
	}
	if len(ds) > 0 {
		st.onTime = float64(onTime) / float64(len(ds))
		st.seenRate = st.accepts * float64(n) / float64(len(ds))
	}
	st.timed = len(ds)
	st.gaps = summarize(ds)
	st.rateShare = min(1, st.rate/(float64(n)/probeInterval.Seconds()))
	cpu := (b.user - a.user) + (b.sys - a.sys)
	st.regnodeCPU = cpu.Seconds() / dt
	if cpu > 0 {
		st.userShare = (b.user - a.user).Seconds() / cpu.Seconds()
		st.perCPU = (b.probes - a.probes) / cpu.Seconds()
	}
	st.targetCPU = (b.targets - a.targets).Seconds() / dt
	st.benchCPU = (b.bench - a.bench).Seconds() / dt
	st.pass = st.onTime >= probeOnTime
	return st, nil
}

// profile writes a CPU profile of the regnode over the window to file.
func (g *probeRig) profile(ctx context.Context, p *regnodeProc, file string) {
	url := fmt.Sprintf("http://%s/debug/pprof/profile?seconds=%d", p.metrics, max(1, int(g.e.cfg.probeWindow.Seconds())))
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, url, nil)
	if err != nil {
		return
	}
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		return
	}
	defer resp.Body.Close()
	f, err := os.Create(file)
	if err != nil {
		return
	}
	defer f.Close()
	_, _ = io.Copy(f, resp.Body)
}

// detect registers a victim on listener idx, waits until it is HEALTHY
// in etcd and has been probed a few more times, kills its listener, and
// returns the time until etcd holds it DEGRADED, then UNAVAILABLE.
func (g *probeRig) detect(ctx context.Context, idx int) (deg, unav time.Duration, err error) {
	ctx, cancel := context.WithTimeout(ctx, 90*time.Second)
	defer cancel()
	if err := g.tg.grow(probeVictims); err != nil {
		return 0, 0, err
	}
	in := probeInstance(0, g.tg.addrs[idx], g.lease)
	in.Id = fmt.Sprintf("victim%d", idx)
	in.Health = nil // its first verdict is the start of the measurement
	key := g.keys.Instance(in.Service, in.Id)
	v, err := record.Encode(in)
	if err != nil {
		return 0, 0, err
	}
	put, err := g.cli.Put(ctx, key, string(v), clientv3.WithLease(g.lease))
	if err != nil {
		return 0, 0, err
	}
	defer func() { _, _ = g.cli.Delete(context.WithoutCancel(ctx), key) }()
	wch := g.cli.Watch(ctx, key, clientv3.WithRev(put.Header.Revision+1))
	state := func() (registryv1.HealthState, time.Time, error) {
		for resp := range wch {
			at := time.Now()
			if err := resp.Err(); err != nil {
				return 0, at, err
			}
			for _, ev := range resp.Events {
				if ev.Type != clientv3.EventTypePut {
					continue
				}
				got, err := g.keys.Decode(string(ev.Kv.Key), ev.Kv.Value, ev.Kv.CreateRevision, ev.Kv.ModRevision)
				if err != nil {
					return 0, at, err
				}
				return got.GetHealth().GetState(), at, nil
			}
		}
		return 0, time.Now(), fmt.Errorf("watch of %s ended: %w", key, ctx.Err())
	}
	st, _, err := state()
	if err != nil {
		return 0, 0, err
	}
	if st != registryv1.HealthState_HEALTH_STATE_HEALTHY {
		return 0, 0, fmt.Errorf("victim's first health is %s, want HEALTHY", st)
	}
	// A few probes while healthy: the kill lands at a random point of
	// its probe cycle, as a real crash would.
	sleep(ctx, 2*probeInterval+probeInterval/3)
	killed, err := g.tg.kill(idx)
	if err != nil {
		return 0, 0, err
	}
	for {
		st, at, err := state()
		if err != nil {
			return deg, unav, err
		}
		switch st {
		case registryv1.HealthState_HEALTH_STATE_DEGRADED:
			if deg == 0 {
				deg = at.Sub(killed)
			}
		case registryv1.HealthState_HEALTH_STATE_UNAVAILABLE:
			if deg == 0 {
				deg = at.Sub(killed)
			}
			return deg, at.Sub(killed), nil
		}
	}
}

// sortedSteps is the steps of a side by N (the table reads better so).
func sortedSteps(o *probeOutcome) []probeStep {
	s := slices.Clone(o.steps)
	slices.SortFunc(s, func(a, b probeStep) int { return a.n - b.n })
	return s
}
