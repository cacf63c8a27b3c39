package main

import (
	"bufio"
	"bytes"
	"context"
	"fmt"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/backoff"
	"google.golang.org/grpc/credentials/insecure"
	healthpb "google.golang.org/grpc/health/grpc_health_v1"

	registryv1 "github.com/regcluster/registry/proto/registry/v1"
)

// fastReconnect is the dial option of the connections that wait for a
// regnode starting up: grpc's default reconnect backoff (1s, growing)
// after the first refused dial would be measured as the regnode's start.
var fastReconnect = grpc.WithConnectParams(grpc.ConnectParams{Backoff: backoff.Config{
	BaseDelay: 5 * time.Millisecond, Multiplier: 1.2, Jitter: 0.1, MaxDelay: 20 * time.Millisecond}, MinConnectTimeout: time.Second})

// regnodeBinary makes a temporary directory (pattern as os.MkdirTemp's,
// removed when e closes) and returns it with the regnode binary to run:
// -regnode-bin, or cmd/regnode built into that directory.
func regnodeBinary(ctx context.Context, e *env, pattern string) (dir, bin string, err error) {
	if dir, err = os.MkdirTemp("", pattern); err != nil {
		return "", "", err
	}
	e.onClose(func() { os.RemoveAll(dir) })
	if bin = e.cfg.regnodeBin; bin != "" {
		return dir, bin, nil
	}
	e.progress.set("building regnode")
	bin = filepath.Join(dir, "regnode")
	out, err := exec.CommandContext(ctx, "go", "build", "-o", bin, "github.com/regcluster/registry/cmd/regnode").CombinedOutput()
	if err != nil {
		return "", "", fmt.Errorf("build regnode (run regbench inside the repository, or give -regnode-bin): %w\n%s", err, out)
	}
	return dir, bin, nil
}

// regnodeProc is one regnode process, a client of an external etcd.
type regnodeProc struct {
	name, api, metrics string
	cmd                *exec.Cmd
	startedAt          time.Time
	cc                 *grpc.ClientConn // health checks while it starts (fastReconnect)
	calls              *grpc.ClientConn // the scenario's calls
	reg                registryv1.RegistryClient

	killed atomic.Bool // by kill, not by itself
	mu     sync.Mutex
	stderr bytes.Buffer
	done   chan struct{}
}

type procWriter struct{ p *regnodeProc }

func (w procWriter) Write(b []byte) (int, error) {
	w.p.mu.Lock()
	defer w.p.mu.Unlock()
	if w.p.stderr.Len() < 1<<20 {
		w.p.stderr.Write(b)
	}
	return len(b), nil
}

func (p *regnodeProc) tail() string {
	p.mu.Lock()
	defer p.mu.Unlock()
	s := p.stderr.String()
	if len(s) > 2000 {
		s = s[len(s)-2000:]
	}
	return s
}

// startRegnodeProc execs bin as regnode name on etcdURL with no per-peer
// limits (every subscriber and writer of the scenario is one loopback
// peer) and its runtime profiles on (--enable-pprof, on loopback: profile
// a regnode under load with go tool pprof http://METRICS/debug/pprof/profile);
// dir holds its data directory. It does not wait for it to serve.
func startRegnodeProc(bin, name, etcdURL, dir string) (*regnodeProc, error) {
	return startRegnodeProcOn(bin, name, etcdURL, dir, "")
}

// startRegnodeProcOn is startRegnodeProc with the process pinned to the
// CPUs of cpus (taskset -c CPUS; "" pins nothing) and extra flags.
func startRegnodeProcOn(bin, name, etcdURL, dir, cpus string, extra ...string) (*regnodeProc, error) {
	ap, err1 := freePort()
	mp, err2 := freePort()
	if err1 != nil || err2 != nil {
		return nil, fmt.Errorf("ports for %s: %v %v", name, err1, err2)
	}
	p := &regnodeProc{name: name, api: fmt.Sprintf("127.0.0.1:%d", ap), metrics: fmt.Sprintf("127.0.0.1:%d", mp), done: make(chan struct{})}
	p.cmd = exec.Command(bin, "--etcd-endpoints", etcdURL, "--name", name, "--listen", p.api, "--metrics-listen", p.metrics,
		"--data-dir", filepath.Join(dir, name), "--log-level", "warn", "--shutdown-grace", "500ms", "--enable-pprof",
		"--write-rate", "1e9", "--write-burst", "1000000", "--keepalive-rate", "1e9", "--keepalive-burst", "1000000",
		"--max-streams-per-peer", "100000000", "--max-registrations-per-peer", "100000000", "--max-writes-in-flight-per-peer", "100000")
	p.cmd.Args = append(p.cmd.Args, extra...)
	if cpus != "" {
		// taskset execs the regnode in its own place: the pid is the regnode's.
		p.cmd = exec.Command("taskset", append([]string{"-c", cpus}, p.cmd.Args...)...)
	}
	p.cmd.Stderr = procWriter{p}
	p.startedAt = time.Now()
	if err := p.cmd.Start(); err != nil {
		return nil, fmt.Errorf("start %s: %w", name, err)
	}
	go func() { _ = p.cmd.Wait(); close(p.done) }()
	cc, err := grpc.NewClient(p.api, grpc.WithTransportCredentials(insecure.NewCredentials()), fastReconnect)
	if err != nil {
		p.kill()
		return nil, err
	}
	p.cc = cc
	// The calls have grpc's own connect timeout (20s), not fastReconnect's
	// 1s, and wait for the connection to be ready instead of failing fast:
	// a regnode serving 4,000 subscribers on a saturated machine may take
	// more than a second to answer a new connection's handshake, and the
	// calls would fail Unavailable on the dial, five attempts in a row,
	// before the regnode had said anything (a full run ended so).
	calls, err := grpc.NewClient(p.api, grpc.WithTransportCredentials(insecure.NewCredentials()),
		grpc.WithDefaultCallOptions(grpc.WaitForReady(true)))
	if err != nil {
		p.kill()
		return nil, err
	}
	p.calls, p.reg = calls, registryv1.NewRegistryClient(calls)
	return p, nil
}

// waitServing waits until the regnode answers its health check SERVING.
func (p *regnodeProc) waitServing(ctx context.Context) error {
	hc := healthpb.NewHealthClient(p.cc)
	for {
		cctx, cancel := context.WithTimeout(ctx, time.Second)
		resp, err := hc.Check(cctx, &healthpb.HealthCheckRequest{Service: "registry.v1.Registry"})
		cancel()
		if err == nil && resp.Status == healthpb.HealthCheckResponse_SERVING {
			return nil
		}
		select {
		case <-p.done:
			return fmt.Errorf("%s exited before serving: %s", p.name, p.tail())
		case <-ctx.Done():
			return fmt.Errorf("%s not serving: %w (last: %v)\n%s", p.name, ctx.Err(), err, p.tail())
		case <-time.After(10 * time.Millisecond):
		}
	}
}

// waitCount waits until the regnode's cache holds at least n instances.
func (p *regnodeProc) waitCount(ctx context.Context, n int64) error {
	var last int64
	for {
		resp, err := p.reg.Status(ctx, &registryv1.StatusRequest{})
		if err == nil {
			last = resp.GetCounts().GetTotal()
			if last >= n {
				return nil
			}
		}
		select {
		case <-ctx.Done():
			return fmt.Errorf("%s holds %d instances, want %d: %w", p.name, last, n, ctx.Err())
		case <-time.After(50 * time.Millisecond):
		}
	}
}

// rss is the process's resident set (VmRSS).
func (p *regnodeProc) rss() int64 {
	b, err := os.ReadFile(fmt.Sprintf("/proc/%d/status", p.cmd.Process.Pid))
	if err != nil {
		return -1
	}
	for line := range strings.Lines(string(b)) {
		if rest, ok := strings.CutPrefix(line, "VmRSS:"); ok {
			kb, err := strconv.ParseInt(strings.TrimSpace(strings.TrimSuffix(strings.TrimSpace(rest), "kB")), 10, 64)
			if err != nil {
				return -1
			}
			return kb << 10
		}
	}
	return -1
}

// procCPU is a process's user+system CPU time so far, from
// /proc/PID/stat (in clock ticks of 1/100s, as Linux reports them).
func procCPU(pid int) time.Duration {
	u, s := procTimes(pid)
	if u < 0 {
		return -1
	}
	return u + s
}

// procTimes is a process's user and system CPU time so far (-1, -1 if
// /proc/PID/stat cannot be read).
func procTimes(pid int) (user, sys time.Duration) {
	b, err := os.ReadFile(fmt.Sprintf("/proc/%d/stat", pid))
	if err != nil {
		return -1, -1
	}
	// The command name (field 2) is in parentheses and may hold spaces.
	rest := string(b[bytes.LastIndexByte(b, ')')+1:])
	f := strings.Fields(rest) // f[0] is field 3 (state)
	if len(f) < 13 {
		return -1, -1
	}
	ut, err1 := strconv.ParseInt(f[11], 10, 64)
	st, err2 := strconv.ParseInt(f[12], 10, 64)
	if err1 != nil || err2 != nil {
		return -1, -1
	}
	return time.Duration(ut) * 10 * time.Millisecond, time.Duration(st) * 10 * time.Millisecond
}

// metric sums the samples of a metric family from the regnode's /metrics
// (-1 if it cannot be read).
func (p *regnodeProc) metric(ctx context.Context, name string) float64 {
	return p.scrape(ctx, name)[0]
}

// scrape is metric for several names, all read from one scrape, so that
// they describe one moment (each -1 if /metrics cannot be read). A name
// may carry its labels as /metrics prints them: `m{result="ok"}`.
func (p *regnodeProc) scrape(ctx context.Context, names ...string) []float64 {
	sums := make([]float64, len(names))
	fail := func() []float64 {
		for i := range sums {
			sums[i] = -1
		}
		return sums
	}
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, "http://"+p.metrics+"/metrics", nil)
	if err != nil {
		return fail()
	}
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		return fail()
	}
	defer resp.Body.Close()
	sc := bufio.NewScanner(resp.Body)
	sc.Buffer(make([]byte, 64<<10), 4<<20)
	for sc.Scan() {
		line := sc.Text()
		for i, name := range names {
			if !strings.HasPrefix(line, name) || (len(line) > len(name) && line[len(name)] != ' ' && line[len(name)] != '{') {
				continue
			}
			f := strings.Fields(line)
			if v, err := strconv.ParseFloat(f[len(f)-1], 64); err == nil {
				sums[i] += v
			}
		}
	}
	return sums
}

// kill SIGKILLs the process and waits until it is reaped.
func (p *regnodeProc) kill() {
	select {
	case <-p.done:
	default:
		p.killed.Store(true)
		_ = p.cmd.Process.Signal(syscall.SIGKILL)
		<-p.done
	}
	if p.cc != nil {
		p.cc.Close()
	}
	if p.calls != nil {
		p.calls.Close()
	}
}
