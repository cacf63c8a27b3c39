// Command regbench measures the registry against its baselines, in the
// spirit of etcd's own benchmark command: each workload runs against our
// stack (SDK → regnode → etcd) AND against what one would use without it
// (raw etcd calls, etcd watchers, etcd's naming resolver), in the same
// process, on the same embedded etcd, in alternating rounds, so the figures
// that matter are ratios that hold on a noisy machine.
//
//	regbench SCENARIO [flags]       SCENARIO: register, propagate, compaction,
//	                                failover, fanout, resync, pick, flood, scale,
//	                                firstcall, probe, or all;
//	                                or several, comma-separated, run in that order
//
// It starts everything it needs itself (embedded etcd, regnodes via
// node.Start, gRPC backends, subscribers; all on loopback), prints a
// progress line on stderr, then a table (on stdout; on stderr with -json)
// and with -json one JSON object per scenario on stdout:
//
//	{"scenario", "params", "ours": {case: {metric: v}},
//	 "baseline": {name: {case: {metric: v}}}, "ratio": {name: {case: {metric: ours/baseline}}},
//	 "targets": [{"name","want","got","met"}], "notes": [...], "seconds"}
//
// Latencies are objects {"p50","p99","max","n"} in milliseconds. -short
// runs every scenario in a short form (make bench). Every scenario has a
// hard deadline (-timeout) and stops by itself.
//
// To see what limits a figure: -cpuprofile FILE profiles the whole run;
// every goroutine carries a pprof label side=etcd|regnode|client|writer|
// backend, so `go tool pprof -tags` splits it by component and
// -tagfocus=side=regnode isolates one. -propagate-kinds runs one kind of
// propagate's consumers alone; -memprofile FILE writes fanout's heap
// profiles before and after subscribing (for pprof -diff_base).
package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"io"
	"os"
	"os/signal"
	"runtime"
	"runtime/pprof"
	"strconv"
	"strings"
	"syscall"
	"time"
)

type scenario struct {
	name string
	run  func(ctx context.Context, e *env) (*Result, error)
}

var scenarios = []scenario{
	{"register", runRegister},
	{"propagate", runPropagate},
	{"compaction", runCompaction},
	{"failover", runFailover},
	{"fanout", runFanout},
	{"resync", runResync},
	{"pick", runPick},
	{"flood", runFlood},
	{"scale", runScale},
	{"firstcall", runFirstCall},
	{"probe", runProbe},
}

// intList is a flag of comma-separated integers.
type intList []int

func (l *intList) String() string {
	s := make([]string, len(*l))
	for i, v := range *l {
		s[i] = strconv.Itoa(v)
	}
	return strings.Join(s, ",")
}

func (l *intList) Set(v string) error {
	var out intList
	for _, f := range strings.Split(v, ",") {
		n, err := strconv.Atoi(strings.TrimSpace(f))
		if err != nil || n < 1 {
			return fmt.Errorf("%q is not a positive integer", f)
		}
		out = append(out, n)
	}
	*l = out
	return nil
}

type config struct {
	short, json, verbose bool
	timeout              time.Duration
	cpuprofile           string
	memprofile           string

	regConc   intList
	regOps1   int // registrations per side at concurrency 1 (split over rounds)
	regOpsN   int // ... at higher concurrency
	regRounds int

	propSubs      intList
	propRate      float64
	propWrites    int // per kind and round
	propRounds    int
	propInstances int
	propKinds     []string
	perClient     int // subscribers (or etcd watchers/resolvers) per client connection

	compSubs  int
	compChurn int
	compRing  int
	compWait  time.Duration

	foBackends, foTrials, foConns, foRPS int
	foProbe, foWork, foReroute           time.Duration

	fanSubs    int
	fanRate    float64
	fanDur     time.Duration
	fanClients int // clients the child's subscribers (either side) are spread over

	resyncN       int
	resyncRepeats int

	firstTrials int

	pickN      intList
	pickOps    int
	pickRounds int

	floodN, floodConc, floodCalls, floodInstances, floodCap, floodInFlight int
	floodModes                                                             []string

	scaleN, scaleS, scaleProcs, scaleChanges, scaleWave int
	scaleRate                                           float64
	scaleRoll                                           intList
	scaleTimeout                                        time.Duration
	regnodeBin                                          string

	probeStart, probeMax, probeBisect      int
	probeTimedEvery                        int
	probeWindow, probeWarmup, probeTimeout time.Duration
	probeProfile                           string
}

func main() {
	if len(os.Args) > 1 && os.Args[1] == childArg {
		os.Exit(childMain(os.Args[2:], os.Stdin, os.Stdout))
	}
	if len(os.Args) > 1 && os.Args[1] == scaleChildArg {
		os.Exit(scaleChildMain(os.Args[2:], os.Stdin, os.Stdout))
	}
	if len(os.Args) > 1 && os.Args[1] == firstCallArg {
		os.Exit(firstCallMain(os.Args[2:]))
	}
	if len(os.Args) > 1 && os.Args[1] == probeTargetsArg {
		os.Exit(probeTargetsMain(os.Stdin, os.Stdout))
	}
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	code := run(ctx, os.Args[1:], os.Stdout, os.Stderr)
	stop()
	os.Exit(code)
}

func usage(w io.Writer, fs *flag.FlagSet) {
	fmt.Fprintf(w, "usage: regbench SCENARIO [flags]\n\nscenarios:")
	for _, s := range scenarios {
		fmt.Fprintf(w, " %s", s.name)
	}
	fmt.Fprintf(w, " all (or several, comma-separated: register,resync)\n\nflags:\n")
	fs.SetOutput(w)
	fs.PrintDefaults()
}

// parse reads the command line; -short changes the defaults of every
// flag not given explicitly.
func parse(args []string, stderr io.Writer) (string, *config, error) {
	c := &config{regConc: intList{1, 32}, propSubs: intList{1, 100, 1000}, pickN: intList{3, 10, 100}, scaleRoll: intList{100, 200}}
	fs := flag.NewFlagSet("regbench", flag.ContinueOnError)
	fs.SetOutput(io.Discard)
	fs.BoolVar(&c.short, "short", false, "a short form of every scenario (what make bench runs)")
	fs.BoolVar(&c.json, "json", false, "print one JSON object per scenario on stdout (the table goes to stderr)")
	fs.BoolVar(&c.verbose, "v", false, "log warnings of etcd and regnode to stderr")
	fs.DurationVar(&c.timeout, "timeout", 6*time.Minute, "hard deadline of each scenario")
	fs.StringVar(&c.cpuprofile, "cpuprofile", "", "write a CPU profile of the whole run to this file")
	fs.StringVar(&c.memprofile, "memprofile", "", "fanout: write heap profiles (every allocation) before and after subscribing in-process (ours) to FILE.before and FILE")

	fs.Var(&c.regConc, "register-conc", "register: concurrencies")
	fs.IntVar(&c.regOps1, "register-ops-1", 2000, "register: registrations per side at concurrency 1")
	fs.IntVar(&c.regOpsN, "register-ops-n", 16000, "register: registrations per side at higher concurrency")
	fs.IntVar(&c.regRounds, "register-rounds", 4, "register: alternating rounds (ours, raw)")

	fs.Var(&c.propSubs, "propagate-subs", "propagate: numbers of subscribers S")
	fs.Float64Var(&c.propRate, "propagate-rate", 50, "propagate: changes per second")
	fs.IntVar(&c.propWrites, "propagate-writes", 250, "propagate: changes per kind and round")
	fs.IntVar(&c.propRounds, "propagate-rounds", 3, "propagate: rounds (ours, etcd watchers, etcd resolvers, rotating)")
	fs.IntVar(&c.propInstances, "propagate-instances", 20, "propagate: instances of the service")
	kinds := fs.String("propagate-kinds", kindOurs+","+kindXDS+","+kindWatch+","+kindResolver, "propagate: which kinds write in the rounds (to profile one alone)")
	fs.IntVar(&c.perClient, "per-client", 10, "subscribers, etcd watchers or resolvers per client connection")

	fs.IntVar(&c.compSubs, "compaction-subs", 100, "compaction: subscribers and resolvers")
	fs.IntVar(&c.compChurn, "compaction-churn", 1000, "compaction: changes while cut off")
	fs.IntVar(&c.compRing, "compaction-ring", 256, "compaction: regnode's ring of recent events")
	fs.DurationVar(&c.compWait, "compaction-wait", 15*time.Second, "compaction: bound on the wait to converge")

	fs.IntVar(&c.foBackends, "failover-backends", 3, "failover: gRPC backends")
	fs.IntVar(&c.foTrials, "failover-trials", 5, "failover: kills (one backend each, restarted after)")
	fs.IntVar(&c.foConns, "failover-conns", 4, "failover: subscribers (each its own SDK client and etcd client, and one channel per side)")
	fs.IntVar(&c.foRPS, "failover-rps", 50, "failover: calls per second per channel (three channels per subscriber: ours, round_robin over our resolver, over etcd's naming resolver)")
	fs.DurationVar(&c.foProbe, "probe-interval", 100*time.Millisecond, "failover: regnode probe interval")
	fs.DurationVar(&c.foWork, "failover-work", 50*time.Millisecond, "failover: backend time per call (so that calls are in flight at a kill)")
	fs.DurationVar(&c.foReroute, "failover-reroute-wait", 15*time.Second, "failover: bound on the wait for every channel to call a restarted backend again")

	fs.IntVar(&c.fanSubs, "fanout-subs", 10000, "fanout: subscribers on one regnode")
	fs.Float64Var(&c.fanRate, "fanout-rate", 20, "fanout: changes per second during the CPU phase")
	fs.DurationVar(&c.fanDur, "fanout-duration", 10*time.Second, "fanout: length of the CPU phase")
	fs.IntVar(&c.fanClients, "fanout-clients", 1, "fanout: clients the child process spreads its subscriptions (SDK clients) and etcd watchers (clientv3 clients) over; one SDK client's subscriptions of a service share one subscriber on the regnode, so S gives the regnode S")

	fs.IntVar(&c.resyncN, "resync-instances", 100000, "resync: instances in etcd")
	fs.IntVar(&c.resyncRepeats, "resync-repeats", 3, "resync: repeats of each measure")

	fs.IntVar(&c.firstTrials, "firstcall-trials", 20, "firstcall: fresh processes per side (alternating)")
	fs.Var(&c.pickN, "pick-endpoints", "pick: numbers of ready endpoints N")
	fs.IntVar(&c.pickOps, "pick-ops", 1000000, "pick: picks per measure")
	fs.IntVar(&c.pickRounds, "pick-rounds", 5, "pick: alternating rounds (each side measured once per round)")

	fs.IntVar(&c.floodN, "flood-registers", 2000, "flood: Registers the attacker sends")
	fs.IntVar(&c.floodConc, "flood-conc", 64, "flood: the attacker's Registers in flight")
	fs.IntVar(&c.floodCalls, "flood-calls", 500, "flood: the victim's Lists while idle (during the flood it lists until the flood is over)")
	fs.IntVar(&c.floodInstances, "flood-instances", 50, "flood: instances of the victim's service")
	fs.IntVar(&c.floodCap, "flood-cap", 0, "flood: registrations a peer (or token) may hold (0: the regnode's default)")
	fs.IntVar(&c.floodInFlight, "flood-in-flight", 0, "flood: writes of a peer (or token) running at once (0: the regnode's default)")
	modes := fs.String("flood-modes", floodPeer+","+floodToken, "flood: modes to run, in order: "+floodPeer+
		" (auth off, attacker and victim two peer addresses), "+floodToken+" (--auth, two tokens from one address)")

	fs.IntVar(&c.scaleN, "scale-instances", 100000, "scale: instances in the registry")
	fs.IntVar(&c.scaleS, "scale-subs", 10000, "scale: subscribers (each its own SDK client of the three regnodes)")
	fs.IntVar(&c.scaleProcs, "scale-procs", 4, "scale: child processes the subscribers are spread over")
	fs.IntVar(&c.scaleChanges, "scale-changes", 100, "scale: changes through one regnode (and, baseline, straight into etcd) for propagation")
	fs.Float64Var(&c.scaleRate, "scale-rate", 10, "scale: most changes per second for propagation (each waits for every subscriber to have the one before)")
	fs.Var(&c.scaleRoll, "scale-roll", "scale: sizes of the services restarted (rolling), each instance deregistered and registered again")
	fs.IntVar(&c.scaleWave, "scale-wave", 5, "scale: instances restarted at once in a rolling restart")
	fs.DurationVar(&c.scaleTimeout, "scale-timeout", 40*time.Minute, "scale: hard deadline of the scenario (instead of -timeout)")
	fs.StringVar(&c.regnodeBin, "regnode-bin", "", "scale, probe: the regnode binary to run (default: go build ./cmd/regnode into a temporary directory)")

	fs.IntVar(&c.probeStart, "probe-start", 2000, "probe: checked instances of the first step (then doubled until a side keeps fewer than 95% on time, then bisected)")
	fs.IntVar(&c.probeMax, "probe-max", 40000, "probe: most checked instances of a step")
	fs.IntVar(&c.probeBisect, "probe-bisect", 3, "probe: bisection steps per side after its first step that misses")
	fs.IntVar(&c.probeTimedEvery, "probe-timed-every", 16, "probe: one target listener in this many accepts and times its probes (the sample for on-time shares); the others defer accept (TCP_DEFER_ACCEPT) and cost the targets nothing")
	fs.DurationVar(&c.probeWindow, "probe-window", 10*time.Second, "probe: length of a step's measurement")
	fs.DurationVar(&c.probeWarmup, "probe-warmup", 3*time.Second, "probe: wait between a step's last registration being probed by its owner and its measurement")
	fs.DurationVar(&c.probeTimeout, "probe-deadline", 10*time.Minute, "probe: hard deadline of the scenario (instead of -timeout); the two sides share it")
	fs.StringVar(&c.probeProfile, "probe-profile", "", "probe: write each regnode's CPU profile of every step's window to PREFIX-NAME-NN.pprof")

	var name string
	if len(args) > 0 && !strings.HasPrefix(args[0], "-") {
		name, args = args[0], args[1:]
	}
	if err := fs.Parse(args); err != nil {
		usage(stderr, fs)
		return "", nil, err
	}
	if name == "" && fs.NArg() > 0 {
		name = fs.Arg(0)
		if err := fs.Parse(fs.Args()[1:]); err != nil {
			usage(stderr, fs)
			return "", nil, err
		}
	}
	if fs.NArg() > 0 || name == "" {
		usage(stderr, fs)
		return "", nil, errors.New("want exactly one SCENARIO")
	}
	if c.short {
		set := map[string]bool{}
		fs.Visit(func(f *flag.Flag) { set[f.Name] = true })
		short := map[string]string{
			"timeout":           "2m",
			"register-ops-1":    "1200",
			"register-ops-n":    "6000",
			"register-rounds":   "6",
			"propagate-subs":    "1,100,300",
			"propagate-writes":  "60",
			"propagate-rounds":  "4",
			"compaction-subs":   "20",
			"compaction-churn":  "300",
			"compaction-ring":   "128",
			"compaction-wait":   "8s",
			"failover-trials":   "4",
			"failover-conns":    "3",
			"fanout-subs":       "2000",
			"fanout-duration":   "4s",
			"resync-instances":  "20000",
			"resync-repeats":    "3",
			"propagate-rate":    "50",
			"failover-backends": "3",
			"pick-endpoints":    "3,20",
			"firstcall-trials":  "8",
			"pick-ops":          "300000",
			"pick-rounds":       "3",
			"flood-calls":       "300",
			"scale-instances":   "10000",
			"scale-subs":        "1000",
			"scale-procs":       "2",
			"scale-changes":     "50",
			"scale-timeout":     "10m",
			"probe-start":       "1000",
			"probe-max":         "4000",
			"probe-bisect":      "0",
			"probe-window":      "4s",
			"probe-warmup":      "2s",
			"probe-deadline":    "3m",
		}
		for k, v := range short {
			if !set[k] {
				if err := fs.Set(k, v); err != nil {
					return "", nil, err
				}
			}
		}
	}
	for _, k := range strings.Split(*kinds, ",") {
		switch k {
		case kindOurs, kindXDS, kindWatch, kindResolver:
			c.propKinds = append(c.propKinds, k)
		default:
			usage(stderr, fs)
			return "", nil, fmt.Errorf("-propagate-kinds: unknown kind %q", k)
		}
	}
	for _, m := range strings.Split(*modes, ",") {
		switch m {
		case floodPeer, floodToken:
			c.floodModes = append(c.floodModes, m)
		default:
			usage(stderr, fs)
			return "", nil, fmt.Errorf("-flood-modes: unknown mode %q", m)
		}
	}
	for _, v := range []struct {
		flag string
		n    int
	}{{"scale-instances", c.scaleN}, {"scale-subs", c.scaleS}, {"scale-procs", c.scaleProcs}, {"scale-changes", c.scaleChanges}, {"scale-wave", c.scaleWave},
		{"probe-start", c.probeStart}, {"probe-max", c.probeMax}, {"probe-timed-every", c.probeTimedEvery}} {
		if v.n < 1 {
			usage(stderr, fs)
			return "", nil, fmt.Errorf("-%s: %d is not a positive integer", v.flag, v.n)
		}
	}
	if c.probeWindow < 2*probeInterval {
		usage(stderr, fs)
		return "", nil, fmt.Errorf("-probe-window: %s is shorter than two check intervals (%s)", c.probeWindow, 2*probeInterval)
	}
	if c.scaleRate <= 0 {
		usage(stderr, fs)
		return "", nil, fmt.Errorf("-scale-rate: %g is not positive", c.scaleRate)
	}
	if name != "all" {
		for _, n := range strings.Split(name, ",") {
			if find(n) == nil {
				usage(stderr, fs)
				return "", nil, fmt.Errorf("unknown scenario %q", n)
			}
		}
	}
	return name, c, nil
}

func find(name string) *scenario {
	for i := range scenarios {
		if scenarios[i].name == name {
			return &scenarios[i]
		}
	}
	return nil
}

// run is main without the exit: it returns 0, 1 if a scenario failed, or
// 2 on a usage error.
func run(ctx context.Context, args []string, stdout, stderr io.Writer) int {
	name, cfg, err := parse(args, stderr)
	if err != nil {
		fmt.Fprintf(stderr, "regbench: %v\n", err)
		return 2
	}
	if cfg.cpuprofile != "" {
		f, err := os.Create(cfg.cpuprofile)
		if err != nil {
			fmt.Fprintf(stderr, "regbench: %v\n", err)
			return 1
		}
		if err := pprof.StartCPUProfile(f); err != nil {
			fmt.Fprintf(stderr, "regbench: %v\n", err)
			f.Close()
			return 1
		}
		defer func() {
			pprof.StopCPUProfile()
			f.Close()
		}()
	}
	table := stdout
	if cfg.json {
		table = stderr
	}
	list := scenarios
	if name != "all" {
		list = nil
		for _, n := range strings.Split(name, ",") {
			list = append(list, *find(n))
		}
	}
	start := time.Now()
	code := 0
	for _, s := range list {
		if ctx.Err() != nil {
			break
		}
		res := runOne(ctx, cfg, s, stderr)
		res.writeTable(table)
		if cfg.json {
			if err := res.writeJSON(stdout); err != nil {
				fmt.Fprintf(stderr, "regbench: %v\n", err)
				code = 1
			}
		}
		if res.Error != "" {
			code = 1
		}
	}
	fmt.Fprintf(stderr, "\nregbench %s: %.1fs in all (GOMAXPROCS %d, %d CPUs)\n", name,
		time.Since(start).Seconds(), runtime.GOMAXPROCS(0), runtime.NumCPU())
	return code
}

// runOne runs a scenario under its deadline. Should it not return within
// the deadline plus a grace (something ignored its context), the process
// prints every goroutine and exits: the deadline is hard.
func runOne(parent context.Context, cfg *config, s scenario, stderr io.Writer) *Result {
	timeout := cfg.timeout
	switch s.name {
	case "scale":
		timeout = cfg.scaleTimeout
	case "probe":
		timeout = cfg.probeTimeout
	}
	ctx, cancel := context.WithTimeout(parent, timeout)
	defer cancel()
	watchdog := time.AfterFunc(timeout+30*time.Second, func() {
		fmt.Fprintf(stderr, "\nregbench: scenario %s overran its deadline of %s; goroutines:\n", s.name, timeout)
		_ = pprof.Lookup("goroutine").WriteTo(stderr, 1)
		os.Exit(3)
	})
	defer watchdog.Stop()
	e := &env{cfg: cfg, log: quiet(cfg.verbose), progress: startProgress(stderr, s.name)}
	start := time.Now()
	res, err := func() (res *Result, err error) {
		defer e.close()
		return s.run(ctx, e)
	}()
	e.progress.close()
	if res == nil {
		res = newResult(s.name, "")
	}
	if err == nil && ctx.Err() != nil {
		err = ctx.Err()
	}
	if err != nil {
		res.Error = err.Error()
		if errors.Is(err, context.DeadlineExceeded) {
			res.Error += fmt.Sprintf(" (deadline %s)", timeout)
		}
	}
	res.param("short", cfg.short)
	res.param("gomaxprocs", runtime.GOMAXPROCS(0))
	res.Seconds = round3(time.Since(start).Seconds())
	res.finish()
	return res
}
