package client_test

import (
	"context"
	"fmt"
	"os"
	"runtime"
	"testing"
	"time"

	"github.com/regcluster/registry/client"
	"github.com/regcluster/registry/internal/etcdtest"
	"github.com/regcluster/registry/internal/regnodetest"
)

func heap() uint64 {
	runtime.GC()
	runtime.GC()
	var ms runtime.MemStats
	runtime.ReadMemStats(&ms)
	return ms.HeapInuse
}

// TestMeasureStreams is a measurement, not run by default
// (MUX_MEASURE=1, or =distinct for one Subscription per service): the
// regnode's fan-out subscriptions, the goroutines and the heap that
// Subscriptions cost on the one Subscribe stream of a Client, against one
// Watch stream each (Config.WatchPerSubscription), regnode and SDK in one
// process. It checks what the stream promises: fan-out subscriptions and
// goroutines grow with the services, not with the Subscriptions.
//
//	MUX_MEASURE=1 go test -count=1 ./client -run TestMeasureStreams -v
func TestMeasureStreams(t *testing.T) {
	if os.Getenv("MUX_MEASURE") == "" {
		t.Skip("a measurement: set MUX_MEASURE=1 (or distinct)")
	}
	m := etcdtest.Start(t, false)
	direct := m.Client(t)
	rn := regnodetest.StartExternal(t, m.ClientURL)
	services, perService, instances := 10, 100, 200
	if os.Getenv("MUX_MEASURE") == "distinct" {
		services, perService, instances = 500, 1, 2
	}
	var last int64
	for i := range services {
		last = churn(t, direct, fmt.Sprintf("svc-%d", i), instances, uint64(i))
	}
	waitFor(t, time.Minute, "hub", func() bool { return rn.Node.Hub().Revision() >= last })
	for _, watch := range []bool{true, false} {
		c, err := client.New(client.Config{Endpoints: []string{rn.Addr}, WatchPerSubscription: watch})
		if err != nil {
			t.Fatal(err)
		}
		g0, h0 := runtime.NumGoroutine(), heap()
		ctx := context.Background()
		var subs []*client.Subscription
		start := time.Now()
		for i := range services * perService {
			s, err := c.Subscribe(ctx, fmt.Sprintf("svc-%d", i%services), client.SubscribeOptions{})
			if err != nil {
				t.Fatal(err)
			}
			subs = append(subs, s)
		}
		for _, s := range subs {
			if err := s.WaitReady(ctx); err != nil {
				t.Fatal(err)
			}
		}
		ready := time.Since(start)
		time.Sleep(2 * time.Second)
		g1, h1 := runtime.NumGoroutine(), heap()
		n := len(subs)
		t.Logf("WatchPerSubscription=%v: %d subscriptions (%d services x %d, %d instances each): hub subscriptions %d, goroutines +%d (%.2f per subscription), heap +%.1f KiB per subscription (regnode and SDK in one process), all ready in %s",
			watch, n, services, perService, instances, rn.Node.Hub().Subscribers(), g1-g0, float64(g1-g0)/float64(n), float64(int64(h1)-int64(h0))/1024/float64(n), ready.Round(time.Millisecond))
		if !watch {
			if hs := rn.Node.Hub().Subscribers(); hs != services {
				t.Errorf("one stream: %d fan-out subscriptions for %d services", hs, services)
			}
			if g := g1 - g0; g > 2*services+20 {
				t.Errorf("one stream: %d goroutines for %d Subscriptions of %d services, want them bounded by the services", g, n, services)
			}
		}
		for _, s := range subs {
			s.Close()
		}
		c.Close()
		waitFor(t, time.Minute, "hub empty", func() bool { return rn.Node.Hub().Subscribers() == 0 })
	}
}
