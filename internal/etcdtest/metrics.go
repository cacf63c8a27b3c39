package etcdtest

import (
	"testing"

	"github.com/prometheus/client_golang/prometheus"
)

// KeepAliveStreams is how many LeaseKeepAlive streams the etcd servers of
// this process have opened (etcd's own grpc_server_started_total).
func KeepAliveStreams(t testing.TB) float64 {
	t.Helper()
	mfs, err := prometheus.DefaultGatherer.Gather()
	if err != nil {
		t.Fatal(err)
	}
	for _, mf := range mfs {
		if mf.GetName() != "grpc_server_started_total" {
			continue
		}
		for _, m := range mf.Metric {
			for _, l := range m.Label {
				if l.GetName() == "grpc_method" && l.GetValue() == "LeaseKeepAlive" {
					return m.GetCounter().GetValue()
				}
			}
		}
	}
	return 0
}
