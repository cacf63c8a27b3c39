package integration

import (
	"context"
	"errors"
	"path/filepath"
	"sync"
	"testing"
	"time"

	"github.com/regcluster/registry/client"
	"github.com/regcluster/registry/internal/embedded"
	"github.com/regcluster/registry/internal/epoch"
	"github.com/regcluster/registry/internal/etcdtest"
)

// restore stops every member, restores the snapshot at path into a new data
// dir of each (etcd's own restore, same names, peer URLs and token), and
// starts them again behind the same URLs.
func restore(t *testing.T, members []*Member, path string) {
	t.Helper()
	for _, m := range members {
		m.Stop()
	}
	for _, m := range members {
		cfg := m.cfg
		dir := filepath.Join(t.TempDir(), cfg.Name+"-restored")
		etcdtest.Restore(t, path, cfg.Name, dir, cfg.ListenPeerURLs[0], cfg.InitialCluster, "regnode")
		m.cfg.Dir = dir
	}
	var wg sync.WaitGroup
	errs := make([]error, len(members))
	for i, m := range members {
		wg.Add(1)
		go func() { // members wait for each other
			defer wg.Done()
			ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
			defer cancel()
			e, err := embedded.Start(ctx, m.cfg)
			m.mu.Lock()
			m.m = e
			m.mu.Unlock()
			errs[i] = err
		}()
	}
	wg.Wait()
	if err := errors.Join(errs...); err != nil {
		t.Fatalf("start the restored members: %v", err)
	}
}

// split cuts s's views at its last new-epoch reset: the views of the old
// history and those of the restored one, as subscribers the checker judges
// against each history.
func split(s *Subscriber) (before, after *Subscriber, ok bool) {
	views := s.Views()
	k := -1
	for i, v := range views {
		if v.NewEpoch {
			k = i
		}
	}
	if k < 0 {
		return nil, nil, false
	}
	return &Subscriber{Name: s.Name + " (before the restore)", views: views[:k]},
		&Subscriber{Name: s.Name + " (after the restore)", views: views[k:]}, true
}

// etcd restored from a snapshot under the workload: the snapshot is saved
// while the regnodes and subscribers run (Maintenance.Snapshot, as
// `etcdctl snapshot save`), the workload goes on past it, then every member
// is stopped and restored into a new data dir with etcd's own restore and
// started behind the same URLs: same cluster id, revisions starting again
// from the snapshot's. One subscriber was cut off before the snapshot (its
// revision is below the snapshot's), one after (above it), and three stay
// connected. Every one ends on the restored state through a new-epoch
// reset; views before it are judged against the old history and views
// from it against the restored one. One of the connected subscribers
// rides a Watch stream per subscription, the others the Client's one
// Subscribe stream.
func TestRestoreEtcdFromSnapshot(t *testing.T) {
	e := setup(t, options{every: 100 * time.Millisecond, external: true})
	var lateLinks []*etcdtest.Proxy
	var lateAddrs []string
	for _, api := range e.cl.APIs() {
		p := etcdtest.NewProxy(t, api)
		lateLinks = append(lateLinks, p)
		lateAddrs = append(lateAddrs, p.Addr())
	}
	late := Follow(t, newClient(t, lateAddrs), "late", 0)
	// The Watch stream per subscription (Config.WatchPerSubscription)
	// goes through the restore too; the others ride the Client's one
	// Subscribe stream, the SDK's default.
	wc, err := client.New(client.Config{Endpoints: e.cl.APIs(), WatchPerSubscription: true})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { wc.Close() })
	e.subs = append(e.subs, late, Follow(t, wc, "all-watch", 0))
	ctx := context.Background()
	oldEpoch, _, err := epoch.Read(ctx, e.cl.Etcd, epoch.Key(""))
	if err != nil || oldEpoch == "" {
		t.Fatalf("epoch before the restore %q: %v", oldEpoch, err)
	}

	time.Sleep(2 * time.Second)
	for _, p := range e.cut { // "cut" stays below the snapshot's revision
		p.Cut()
	}
	cutAt := e.subs[1].Sub.Revision()
	for deadline := time.Now().Add(30 * time.Second); ; { // etcd moves past it
		head, err := e.cl.Etcd.Get(ctx, "cut")
		if err == nil && head.Header.Revision > cutAt+2 {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("etcd did not move past %d", cutAt)
		}
		time.Sleep(50 * time.Millisecond)
	}
	snapPath := filepath.Join(t.TempDir(), "snapshot.db")
	snapRev := etcdtest.SaveSnapshot(t, e.cl.Etcd, snapPath)
	// The workload goes on past the snapshot; "late" follows, then is cut.
	deadline := time.Now().Add(30 * time.Second)
	for late.Sub.Revision() < snapRev+20 {
		if time.Now().After(deadline) {
			t.Fatalf("late subscriber at %d, snapshot at %d", late.Sub.Revision(), snapRev)
		}
		time.Sleep(50 * time.Millisecond)
	}
	for _, p := range lateLinks {
		p.Cut()
	}
	lateAt := late.Sub.Revision()
	time.Sleep(time.Second)

	// The old history ends here: record all of it, then stop recording.
	head, err := e.cl.Etcd.Get(ctx, "before-restore")
	if err != nil {
		t.Fatal(err)
	}
	oldHead := head.Header.Revision
	e.h.WaitFor(t, oldHead)
	e.h.cancel()
	<-e.h.done
	oldEvents, _ := e.h.Events()

	restoreStart := time.Now()
	restore(t, e.members, snapPath)
	restoreTook := time.Since(restoreStart)
	// The restored history from revision 1 (the snapshot holds it all).
	h2 := RecordHistory(t, e.cl.Etcd)
	time.Sleep(2 * time.Second)
	for _, p := range e.cut {
		p.Heal()
	}
	for _, p := range lateLinks {
		p.Heal()
	}
	time.Sleep(2 * time.Second)
	e.halt()
	e.w.Settle()

	newEpoch, _, err := epoch.Read(ctx, e.cl.Etcd, epoch.Key(""))
	if err != nil || newEpoch == "" || newEpoch == oldEpoch {
		t.Fatalf("epoch after the restore %q (before %q): %v", newEpoch, oldEpoch, err)
	}
	// A registration made after the snapshot has no lease in the restored
	// etcd: its keeper learns so at its next renewal and registers again.
	// Wait for that (the checker wants every open one in etcd at the end).
	open := e.w.Open()
	heldAt := e.waitOpen(open)
	t.Logf("the restore (members stopped, restored, started) took %s; %d open registrations were back %s after it began",
		restoreTook.Round(time.Millisecond), len(open), time.Since(restoreStart).Round(time.Millisecond))
	head, err = e.cl.Etcd.Get(ctx, "settle")
	if err != nil {
		t.Fatal(err)
	}
	rev := head.Header.Revision
	t.Logf("snapshot at revision %d; cut subscriber at %d, late at %d; old etcd reached %d; restored etcd at %d",
		snapRev, cutAt, lateAt, oldHead, rev)
	if cutAt >= snapRev || lateAt <= snapRev {
		t.Fatalf("subscribers not on both sides of the snapshot: cut at %d, late at %d, snapshot at %d", cutAt, lateAt, snapRev)
	}
	for _, s := range e.subs {
		deadline := time.Now().Add(30 * time.Second)
		for s.Sub.Epoch() != newEpoch || s.Sub.Revision() < rev {
			if time.Now().After(deadline) {
				t.Fatalf("subscriber %s at %d on epoch %q, etcd at %d on %q (last error %v)",
					s.Name, s.Sub.Revision(), s.Sub.Epoch(), rev, newEpoch, s.Sub.LastError())
			}
			time.Sleep(20 * time.Millisecond)
		}
		rev = max(rev, s.Sub.Revision())
	}
	h2.WaitFor(t, rev)
	newEvents, upTo := h2.Events()

	var before, after []*Subscriber
	for _, s := range e.subs {
		b, a, ok := split(s)
		if !ok {
			t.Errorf("subscriber %s ended on the restored epoch without a new-epoch reset", s.Name)
			continue
		}
		before, after = append(before, b), append(after, a)
	}
	old := Check(oldEvents, oldHead, before, nil, 0)
	restored := Check(newEvents, upTo, after, open, heldAt)
	t.Logf("workload: %s", e.w)
	t.Logf("old history: %d views against %d events; restored: %d views against %d events, %d drain checks; %d+%d violations",
		old.Views, old.Events, restored.Views, restored.Events, restored.DrainChecks, len(old.Violations), len(restored.Violations))
	for _, v := range append(old.Violations, restored.Violations...) {
		t.Errorf("violation: %s", v)
	}
	if old.Views == 0 || restored.Views < len(after) {
		t.Errorf("too little checked: %d views before, %d after", old.Views, restored.Views)
	}
	for _, s := range e.subs {
		st := s.Sub.Stats()
		if n := st.Cache.NewEpochs; n < 1 {
			t.Errorf("subscriber %s: %d new epochs", s.Name, n)
		}
		t.Logf("subscriber %s: %d new-epoch resets, %d resets, %d reconnects; ends at revision %d of the restored epoch",
			s.Name, st.Cache.NewEpochs, st.Resets, st.Reconnects, s.Sub.Revision())
	}
}
