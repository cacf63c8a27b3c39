package probe

import (
	"context"
	"fmt"
	"sync"
	"sync/atomic"
	"syscall"
	"testing"
	"time"

	"github.com/regcluster/registry/health"
	registryv1 "github.com/regcluster/registry/proto/registry/v1"
)

// benchProbe probes addr with spec in a loop and reports probes/s.
func benchProbe(b *testing.B, addr string, spec *registryv1.HealthCheck) {
	p := newChecker(b, Config{})
	b.ReportAllocs()
	for b.Loop() {
		if r := p.Probe(b.Context(), addr, spec, noSlow); r.Outcome != health.OK {
			b.Fatalf("probe: %v %q", r.Outcome, r.Detail)
		}
	}
	b.ReportMetric(float64(b.N)/b.Elapsed().Seconds(), "probes/s")
}

// BenchmarkProbeTCP is a connect and a reset close per probe, on loopback.
func BenchmarkProbeTCP(b *testing.B) {
	benchProbe(b, tcpListener(b), check(kindTCP, "", 0))
}

// BenchmarkProbeHTTP is a GET per probe over a kept-alive connection.
func BenchmarkProbeHTTP(b *testing.B) {
	benchProbe(b, newHTTPTarget(b).addr, check(kindHTTP, "/healthz", 0))
}

// BenchmarkProbeGRPC is a Health/Check per probe over the cached connection.
func BenchmarkProbeGRPC(b *testing.B) {
	benchProbe(b, newGRPCTarget(b, true).addr, check(kindGRPC, "", 0))
}

// timeWaits is the host's sockets in TIME_WAIT.
func timeWaits(b *testing.B) map[socket]bool {
	tw := map[socket]bool{}
	for _, s := range hostSockets(b) {
		if s.state == tcpTimeWait {
			tw[s] = true
		}
	}
	return tw
}

// BenchmarkProbeCost runs b.N probes as the prober does, 64 at a time, each
// of the 64 workers probing its own target of the given number (64: one
// probe at a time per target, as the prober probes an instance; 4: 16
// instances at one address), and reports probes/s, probes per
// CPU-second of the process (getrusage; the targets run in it too, so this
// is the cost of both ends), and the sockets in TIME_WAIT afterwards: those
// this run left (new since it began, to or from a target's port) and all
// the host's.
// tcp-fin is the TCP probe closing with a FIN, as before SO_LINGER 0, for
// comparison with tcp-linger; its targets wait for the prober to close
// first, as a server waiting for a request does.
func BenchmarkProbeCost(b *testing.B) {
	for _, tc := range []struct {
		name     string
		spec     *registryv1.HealthCheck
		noLinger bool
		targets  int
		target   func(testing.TB) string
	}{
		{"tcp-linger", check(kindTCP, "", 0), false, 64, eofListener},
		{"http-keepalive", check(kindHTTP, "/healthz", 0), false, 64, httpAddr},
		// Probes of one address beyond the one kept connection open and
		// close their own: counted here.
		{"http-shared-4", check(kindHTTP, "/healthz", 0), false, 4, httpAddr},
		{"grpc-cached", check(kindGRPC, "", 0), false, 64, func(t testing.TB) string { return newGRPCTarget(t, true).addr }},
		// Last: the TIME_WAIT sockets it leaves would weigh on the others.
		{"tcp-fin", check(kindTCP, "", 0), true, 64, eofListener},
	} {
		b.Run(tc.name, func(b *testing.B) {
			var addrs []string
			ports := map[int]bool{}
			for range tc.targets {
				a := tc.target(b)
				addrs = append(addrs, a)
				ports[addrPort(b, a)] = true
			}
			p := newChecker(b, Config{})
			if tc.noLinger {
				p.setNoLinger()
			}
			before := timeWaits(b)
			const workers = 64 // the prober's default concurrency
			var next atomic.Int64
			var failed atomic.Value
			var wg sync.WaitGroup
			b.ResetTimer()
			cpu0, t0 := processCPU(b), time.Now()
			for w := range workers {
				wg.Add(1)
				go func() {
					defer wg.Done()
					for next.Add(1) <= int64(b.N) {
						if r := p.Probe(context.Background(), addrs[w%len(addrs)], tc.spec, noSlow); r.Outcome != health.OK {
							failed.Store(fmt.Sprintf("%v %q", r.Outcome, r.Detail))
						}
					}
				}()
			}
			wg.Wait()
			wall, cpu := time.Since(t0), processCPU(b)-cpu0
			b.StopTimer()
			if f := failed.Load(); f != nil {
				b.Fatalf("a probe failed: %s", f)
			}
			after := timeWaits(b)
			ours := 0
			for s := range after {
				if !before[s] && (ports[s.local] || ports[s.remote]) {
					ours++
				}
			}
			b.ReportMetric(float64(b.N)/wall.Seconds(), "probes/s")
			b.ReportMetric(float64(b.N)/cpu.Seconds(), "probes/cpu-s")
			b.ReportMetric(float64(ours), "timewait-run")
			b.ReportMetric(float64(len(after)), "timewait-host")
		})
	}
}

func httpAddr(t testing.TB) string { return newHTTPTarget(t).addr }

// processCPU is the CPU time (user and system) this process has used.
func processCPU(b *testing.B) time.Duration {
	var ru syscall.Rusage
	if err := syscall.Getrusage(syscall.RUSAGE_SELF, &ru); err != nil {
		b.Fatal(err)
	}
	return time.Duration(ru.Utime.Nano() + ru.Stime.Nano())
}
