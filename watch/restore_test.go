package watch_test

import (
	"context"
	"fmt"
	"io"
	"log/slog"
	"path/filepath"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	clientv3 "go.etcd.io/etcd/client/v3"

	"github.com/regcluster/registry/cache"
	"github.com/regcluster/registry/internal/embedded"
	"github.com/regcluster/registry/internal/epoch"
	"github.com/regcluster/registry/internal/etcdtest"
	registryv1 "github.com/regcluster/registry/proto/registry/v1"
	"github.com/regcluster/registry/watch"
)

// startMember runs a one-member etcd named name on fixed URLs in dir.
func startMember(t *testing.T, dir, cu, pu string) *embedded.Member {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	m, err := embedded.Start(ctx, embedded.Config{Name: "m", Dir: dir, ListenClientURLs: []string{cu}, ListenPeerURLs: []string{pu},
		UnsafeNoFsync: true, Logger: slog.New(slog.NewTextHandler(io.Discard, nil))})
	if err != nil {
		t.Fatal(err)
	}
	return m
}

// etcd restored from a snapshot under the same name, URLs and token keeps
// its cluster id; if it is already past the revision the watcher
// delivered when the watcher reaches it again, neither the id nor the
// revision tells: the put the watcher delivered last is not in the
// restored history at its revision. The watcher starts a new epoch
// (replacing the epoch key), and its view is the restored state, not the
// old view continued by the new history's events.
func TestRestoredEtcdAlreadyPastIsANewEpoch(t *testing.T) {
	cu := fmt.Sprintf("http://127.0.0.1:%d", etcdtest.FreePort(t))
	pu := fmt.Sprintf("http://127.0.0.1:%d", etcdtest.FreePort(t))
	m := startMember(t, filepath.Join(t.TempDir(), "d1"), cu, pu)
	var once sync.Once
	stopM := func() { once.Do(m.Close) }
	defer func() { stopM() }()
	direct, err := clientv3.New(clientv3.Config{Endpoints: []string{cu}, DialTimeout: 2 * time.Second, Logger: etcdtest.QuietLogger()})
	if err != nil {
		t.Fatal(err)
	}
	defer direct.Close()
	link, cli := proxied(t, cu)

	key := epoch.Key("")
	c := cache.New()
	var (
		mu       sync.Mutex
		epochs   []string
		newEpoch cache.Batch  // the new epoch's snapshot
		known    atomic.Int64 // records Known gave
	)
	w, err := watch.New(watch.Config{Client: cli, EpochKey: key, Logger: slog.New(slog.NewTextHandler(io.Discard, nil)), MinBackoff: 20 * time.Millisecond, MaxBackoff: 200 * time.Millisecond,
		ProgressInterval: 200 * time.Millisecond,
		// The restored history holds the kept records at the revisions
		// the view has them at.
		Known: knownIn(c, &known)})
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() {
		done <- w.Run(ctx, func(b cache.Batch) error {
			if _, err := c.Apply(b); err != nil {
				t.Errorf("cache refused batch at %d: %v", b.Revision, err)
			}
			if b.Snapshot {
				mu.Lock()
				epochs = append(epochs, b.Epoch)
				if b.NewEpoch {
					newEpoch = b
				}
				mu.Unlock()
			}
			return nil
		})
	}()
	defer func() { cancel(); <-done }()

	for i := range 10 {
		put(t, direct, "orders", fmt.Sprint("kept-", i), "1")
	}
	snap := filepath.Join(t.TempDir(), "snap.db")
	snapRev := etcdtest.SaveSnapshot(t, direct, snap)
	var last int64
	for i := range 20 {
		last = put(t, direct, "orders", fmt.Sprint("lost-", i), "1")
	}
	waitFor(t, 10*time.Second, "the first view", func() bool { return c.Revision() >= last && c.Len() == 30 })
	old := map[*registryv1.Instance]bool{}
	for _, in := range c.Instances("orders") {
		old[in] = true
	}
	first, _, err := epoch.Read(context.Background(), direct, key)
	if err != nil || first == "" {
		t.Fatalf("epoch %q, %v", first, err)
	}

	// The watcher loses etcd; etcd is restored behind the same URL and
	// goes past the revision the watcher delivered before it returns.
	link.Cut()
	stopM()
	d2 := filepath.Join(t.TempDir(), "d2")
	etcdtest.Restore(t, snap, "m", d2, pu, "m="+pu, "regnode")
	m2 := startMember(t, d2, cu, pu)
	defer m2.Close()
	var head int64
	for i := 0; head <= last+5; i++ {
		head = put(t, direct, "orders", fmt.Sprint("new-", i), "2")
	}
	if head <= last || snapRev >= last {
		t.Fatalf("restored etcd at %d, snapshot at %d, delivered %d: not past it", head, snapRev, last)
	}
	link.Heal()

	waitFor(t, 15*time.Second, "the restored state", func() bool { return converged(t, direct, &follower{c: c}) })
	if n := c.Stats().NewEpochs; n != 1 {
		t.Fatalf("%d new epochs, want 1", n)
	}
	if _, ok := c.Get("orders", "lost-0"); ok {
		t.Fatal("a record of the lost history is still in the view")
	}
	now, _, err := epoch.Read(context.Background(), direct, key)
	mu.Lock()
	defer mu.Unlock()
	// Known had the kept records (same revisions) when the list was
	// read; a new epoch's list is read again without it: revisions of
	// one history do not name records of another.
	if known.Load() == 0 {
		t.Fatal("Known never gave a record: the test does not test the new epoch's second read")
	}
	for _, in := range newEpoch.Instances {
		if old[in] {
			t.Fatalf("the new epoch's snapshot carries %s/%s from the old history's view", in.Service, in.Id)
		}
	}
	if len(newEpoch.Instances) == 0 {
		t.Fatal("no new-epoch snapshot")
	}
	if err != nil || now == first || epochs[len(epochs)-1] != now {
		t.Fatalf("epoch in etcd %q (was %q, %v); snapshots carried %v", now, first, err, epochs)
	}
}
