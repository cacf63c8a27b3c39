package prober_test

import (
	"context"
	"fmt"
	"net"
	"os"
	"runtime"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus/testutil"

	"github.com/regcluster/registry/client"
	"github.com/regcluster/registry/internal/etcdtest"
	"github.com/regcluster/registry/internal/node"
	"github.com/regcluster/registry/internal/regnodetest"
	registryv1 "github.com/regcluster/registry/proto/registry/v1"
	"github.com/regcluster/registry/store"
)

// BenchmarkDetection measures the time from killing a backend (its TCP
// listener closes) to a subscriber's cache showing it UNAVAILABLE, with
// probes every 100ms and the default thresholds, against the theoretical
// interval × (N + M) = 800ms. It reports the mean, the worst and the ratio.
func BenchmarkDetection(b *testing.B) {
	const interval = 100 * time.Millisecond
	m := etcdtest.Start(b, false)
	rn := regnodetest.StartWith(b, node.Config{EtcdEndpoints: []string{m.ClientURL}, ProbeInterval: interval,
		SessionTTL: 2 * time.Second}, m.ClientURL)
	c, err := client.New(client.Config{Endpoints: []string{rn.Addr}})
	if err != nil {
		b.Fatal(err)
	}
	defer c.Close()
	lis, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		b.Fatal(err)
	}
	addr := lis.Addr().String()
	stop := serveTCP(lis)
	ctx := context.Background()
	if _, err := c.API().Register(ctx, &registryv1.RegisterRequest{Instance: &registryv1.Instance{Service: "orders", Id: "o-1",
		Address: addr, Check: &registryv1.HealthCheck{Kind: registryv1.CheckKind_CHECK_KIND_TCP}}}); err != nil {
		b.Fatal(err)
	}
	seen := make(chan registryv1.HealthState, 64)
	sub, err := c.Subscribe(ctx, "orders", client.SubscribeOptions{OnChange: func(ch client.Change) {
		for _, in := range append(ch.Updated, ch.Added...) {
			select {
			case seen <- in.GetHealth().GetState():
			default:
			}
		}
	}})
	if err != nil {
		b.Fatal(err)
	}
	defer sub.Close()
	await := func(state registryv1.HealthState) {
		deadline := time.After(30 * time.Second)
		for {
			select {
			case s := <-seen:
				if s == state {
					return
				}
			case <-deadline:
				b.Fatalf("subscriber never saw %v", state)
			}
		}
	}
	await(registryv1.HealthState_HEALTH_STATE_HEALTHY)
	var total, worst time.Duration
	b.ResetTimer()
	for range b.N {
		t0 := time.Now()
		stop()
		await(registryv1.HealthState_HEALTH_STATE_UNAVAILABLE)
		d := time.Since(t0)
		total += d
		worst = max(worst, d)
		b.StopTimer()
		if lis, err = net.Listen("tcp", addr); err != nil {
			b.Fatal(err)
		}
		stop = serveTCP(lis)
		await(registryv1.HealthState_HEALTH_STATE_HEALTHY)
		b.StartTimer()
	}
	stop()
	theory := interval * 8
	mean := total / time.Duration(b.N)
	b.ReportMetric(float64(mean.Milliseconds()), "detect-ms")
	b.ReportMetric(float64(worst.Milliseconds()), "worst-ms")
	b.ReportMetric(float64(theory.Milliseconds()), "theory-ms")
	b.ReportMetric(float64(mean)/float64(theory), "ratio")
	b.ReportMetric(0, "ns/op")
}

// BenchmarkProbeRate measures how many probes per second one leader runs:
// 5,000 instances with TCP checks every 100ms (50,000/s asked for) against
// four loopback listeners, at the default concurrency of 64. It reports
// probes per CPU-second of the process too (getrusage around the measure:
// the process holds the regnode, its etcd and the listeners, so this is
// the whole cost of a probe, its write path included), and the host's
// sockets in TIME_WAIT at the end of the measure, in all and to the
// listeners' ports (0 there: TCP probes close with SO_LINGER 0).
func BenchmarkProbeRate(b *testing.B) {
	m := etcdtest.Start(b, false)
	cli := m.Client(b)
	st, err := store.New(store.Config{Client: cli})
	if err != nil {
		b.Fatal(err)
	}
	var addrs []string
	ports := map[string]bool{} // as /proc/net/tcp writes them: 4 hex digits
	for range 4 {
		lis, err := net.Listen("tcp", "127.0.0.1:0")
		if err != nil {
			b.Fatal(err)
		}
		defer serveTCP(lis)()
		addrs = append(addrs, lis.Addr().String())
		ports[fmt.Sprintf("%04X", lis.Addr().(*net.TCPAddr).Port)] = true
	}
	ctx := context.Background()
	const n = 5000
	for i := range n {
		if _, err := st.Register(ctx, &registryv1.Instance{Service: "bench", Id: fmt.Sprint("i-", i), Address: addrs[i%len(addrs)],
			Check: &registryv1.HealthCheck{Kind: registryv1.CheckKind_CHECK_KIND_TCP}}, time.Hour); err != nil {
			b.Fatal(err)
		}
	}
	rn := regnodetest.StartWith(b, node.Config{EtcdEndpoints: []string{m.ClientURL}, ProbeInterval: 100 * time.Millisecond,
		SessionTTL: 2 * time.Second}, m.ClientURL)
	count := func() float64 {
		var sum float64
		for _, r := range []string{"ok", "slow", "timeout", "error", "unhealthy"} {
			sum += testutil.ToFloat64(rn.Node.Metrics().Probes.WithLabelValues(r))
		}
		return sum
	}
	deadline := time.Now().Add(20 * time.Second)
	for count() < n { // leading, and through the first round
		if time.Now().After(deadline) {
			b.Fatal("the prober did not start")
		}
		time.Sleep(50 * time.Millisecond)
	}
	b.ResetTimer()
	var rate, perCPU float64
	for range b.N {
		c0, t0, cpu0 := count(), time.Now(), processCPU(b)
		time.Sleep(2 * time.Second)
		probes, cpu := count()-c0, processCPU(b)-cpu0
		rate = probes / time.Since(t0).Seconds()
		perCPU = probes / cpu.Seconds()
	}
	b.StopTimer()
	host, probed := timeWait(b, ports)
	b.ReportMetric(rate, "probes/s")
	b.ReportMetric(perCPU, "probes/cpu-s")
	b.ReportMetric(float64(host), "timewait-host")
	b.ReportMetric(float64(probed), "timewait-probed")
	b.ReportMetric(n*10, "asked/s")
	b.ReportMetric(0, "ns/op")
}

// timeWait counts the host's sockets in TIME_WAIT (state 06 in
// /proc/net/tcp and /proc/net/tcp6): all, and those with an end on one of
// ports (hex, as the files write them). Off Linux both are -1.
func timeWait(b *testing.B, ports map[string]bool) (host, probed int) {
	if runtime.GOOS != "linux" {
		return -1, -1
	}
	for _, name := range []string{"/proc/net/tcp", "/proc/net/tcp6"} {
		data, err := os.ReadFile(name)
		if err != nil {
			continue // no IPv6
		}
		for _, line := range strings.Split(string(data), "\n")[1:] {
			// sl local_address rem_address st ...; addresses are HEXIP:HEXPORT
			f := strings.Fields(line)
			if len(f) < 4 || f[3] != "06" {
				continue
			}
			host++
			if ports[f[1][strings.LastIndexByte(f[1], ':')+1:]] || ports[f[2][strings.LastIndexByte(f[2], ':')+1:]] {
				probed++
			}
		}
	}
	return host, probed
}

// processCPU is the CPU time (user and system) this process has used.
func processCPU(b *testing.B) time.Duration {
	var ru syscall.Rusage
	if err := syscall.Getrusage(syscall.RUSAGE_SELF, &ru); err != nil {
		b.Fatal(err)
	}
	return time.Duration(ru.Utime.Nano() + ru.Stime.Nano())
}
