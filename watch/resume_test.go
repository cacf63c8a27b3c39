package watch_test

import (
	"context"
	"fmt"
	"testing"
	"time"

	clientv3 "go.etcd.io/etcd/client/v3"

	"github.com/regcluster/registry/internal/etcdtest"
)

// history is the revisions of every transaction that touched the
// instances prefix in (from, to], read from etcd itself.
func history(t *testing.T, cli *clientv3.Client, from, to int64) []int64 {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	var revs []int64
	for resp := range cli.Watch(ctx, keys.Instances(), clientv3.WithPrefix(), clientv3.WithRev(from+1)) {
		if err := resp.Err(); err != nil {
			t.Fatalf("read etcd's history: %v", err)
		}
		for _, ev := range resp.Events {
			if r := ev.Kv.ModRevision; r <= to && (len(revs) == 0 || revs[len(revs)-1] != r) {
				revs = append(revs, r)
			}
		}
		if resp.Header.Revision >= to {
			return revs
		}
	}
	t.Fatal("etcd's history ended early")
	return nil
}

// The watcher's own resume code, with changes it missed. A cut link alone
// never gets there: etcd's client resumes a broken stream by itself. So
// the watcher's member loses quorum: its require-leader reads and watch
// fail with "no leader" (which etcd's client does not retry), the watch
// ends, and while the watcher is also cut off from its member, changes
// land on the healed cluster. When the link is back, the watcher resumes
// from the last delivered revision + 1: every change arrives exactly once,
// in order, and nothing is relisted.
func TestResumeAfterWatchCanceled(t *testing.T) {
	c := etcdtest.StartCluster(t, 2)
	direct := c.Members[0].Client(t)
	p, cli := proxied(t, c.Members[1].ClientURL)
	for i := range 10 {
		put(t, direct, "orders", fmt.Sprint("o-", i), "0")
	}
	f := follow(t, cli, "orders")
	waitFor(t, 10*time.Second, "the snapshot", func() bool { return converged(t, direct, f) })
	f.mu.Lock()
	snapRev := f.batches[0].Revision
	f.mu.Unlock()

	// No quorum: the member the watcher follows cancels its watch.
	r0 := f.restarts("error")
	c.CutPeers()
	waitFor(t, 30*time.Second, "the watch to end for want of a leader", func() bool { return f.restarts("error") > r0 })
	p.Cut()
	c.HealPeers()
	c.WaitLeader(t, direct, 30*time.Second)
	var last int64
	for i := range 30 { // 20 puts of new instances, 10 deletes of old ones
		if i%3 == 2 {
			r, err := direct.Delete(context.Background(), keys.Instance("orders", fmt.Sprint("o-", i/3)))
			if err != nil || r.Deleted != 1 {
				t.Fatalf("delete o-%d: %d deleted, %v", i/3, r.Deleted, err)
			}
			last = r.Header.Revision
			continue
		}
		last = put(t, direct, "orders", fmt.Sprint("n-", i), "1")
	}
	p.Heal()
	waitFor(t, 30*time.Second, "the watcher to pass the last change", func() bool { return f.c.Revision() >= last })

	want := history(t, direct, snapRev, last)
	var got []int64
	f.mu.Lock()
	for _, b := range f.batches[1:] {
		if b.Snapshot {
			t.Errorf("a snapshot (reset %v) at %d: the watcher relisted instead of resuming", b.Reset, b.Revision)
		}
		if len(b.Events) > 0 && b.Revision <= last {
			got = append(got, b.Revision)
		}
	}
	f.mu.Unlock()
	if fmt.Sprint(got) != fmt.Sprint(want) {
		t.Fatalf("delivered change revisions %v\netcd's history           %v", got, want)
	}
	if len(want) != 30 {
		t.Fatalf("etcd's history has %d changes, want the 30 written", len(want))
	}
	waitFor(t, 10*time.Second, "the view to equal etcd's", func() bool { return converged(t, direct, f) })
	f.assertMonotonic(t)
	if f.c.Stats().Resets != 0 || f.restarts("relist") != 0 {
		t.Fatalf("%d resets, %d relists: a resumable watch was relisted", f.c.Stats().Resets, f.restarts("relist"))
	}
}
