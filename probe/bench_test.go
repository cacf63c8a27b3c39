package probe

import (
	"testing"

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
