package watch_test

import (
	"context"
	"fmt"
	"io"
	"log/slog"
	"sync"
	"testing"
	"time"

	clientv3 "go.etcd.io/etcd/client/v3"

	"github.com/regcluster/registry/cache"
	"github.com/regcluster/registry/internal/embedded"
	"github.com/regcluster/registry/internal/etcdtest"
	"github.com/regcluster/registry/watch"
)

// An idle watch that has seen an event hears one heartbeat per
// ProgressInterval, not two: the linearizable read that confirms the view
// is the heartbeat, and etcd is asked for progress only when it is ahead.
// (Before, the confirmation and etcd's answer to RequestProgress arrived a
// millisecond apart, every interval.) etcd's own progress notifications
// are pushed out of the picture (an hour apart), so every progress batch
// here is the Watcher's; two at the same revision closer than half an
// interval are a double heartbeat. The bound is a lower one: a slow
// machine only spreads heartbeats further apart.
func TestOneHeartbeatPerInterval(t *testing.T) {
	cu := fmt.Sprintf("http://127.0.0.1:%d", etcdtest.FreePort(t))
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	m, err := embedded.Start(ctx, embedded.Config{Name: "hb", Dir: t.TempDir(), ListenClientURLs: []string{cu},
		ListenPeerURLs: []string{fmt.Sprintf("http://127.0.0.1:%d", etcdtest.FreePort(t))}, UnsafeNoFsync: true,
		LogLevel: "error", ProgressNotifyInterval: time.Hour, Logger: slog.New(slog.NewTextHandler(io.Discard, nil))})
	if err != nil {
		t.Fatal(err)
	}
	defer m.Close()
	cli, err := clientv3.New(clientv3.Config{Endpoints: []string{cu}, DialTimeout: 5 * time.Second, Logger: etcdtest.QuietLogger()})
	if err != nil {
		t.Fatal(err)
	}
	defer cli.Close()

	const interval = 100 * time.Millisecond
	w, err := watch.New(watch.Config{Client: cli, ProgressInterval: interval})
	if err != nil {
		t.Fatal(err)
	}
	put(t, cli, "orders", "o-1", "v1")
	type beat struct {
		rev int64
		at  time.Time
	}
	var (
		mu      sync.Mutex
		lastRev int64
		beats   []beat
	)
	wctx, stop := context.WithCancel(ctx)
	snapped := make(chan struct{})
	enough := make(chan struct{})
	done := make(chan error, 1)
	go func() {
		done <- w.Run(wctx, func(b cache.Batch) error {
			mu.Lock()
			defer mu.Unlock()
			switch {
			case b.Snapshot:
				close(snapped)
			case len(b.Events) > 0:
				lastRev = b.Revision
			case lastRev != 0 && b.Revision == lastRev:
				beats = append(beats, beat{b.Revision, time.Now()})
				if len(beats) == 8 {
					close(enough)
				}
			}
			return nil
		})
	}()
	<-snapped
	// The double heartbeat needed a watch that had delivered an event.
	put(t, cli, "orders", "o-2", "v1")
	select {
	case <-enough:
	case <-ctx.Done():
		t.Fatal("no 8 heartbeats at the revision of the last event")
	}
	stop()
	<-done
	mu.Lock()
	defer mu.Unlock()
	for i := 1; i < 8; i++ {
		if gap := beats[i].at.Sub(beats[i-1].at); gap < interval/2 {
			t.Fatalf("heartbeats %d and %d at revision %d only %s apart (interval %s): more than one per interval", i-1, i, beats[i].rev, gap, interval)
		}
	}
}
