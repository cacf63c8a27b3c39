package leasepool_test

import (
	"context"
	"errors"
	"sync"
	"testing"
	"time"

	clientv3 "go.etcd.io/etcd/client/v3"
	"go.uber.org/goleak"

	"github.com/regcluster/registry/internal/etcdtest"
	"github.com/regcluster/registry/internal/leasepool"
)

func TestMain(m *testing.M) { goleak.VerifyTestMain(m, etcdtest.LeakOptions()...) }

func waitUntil(t *testing.T, what string, cond func() bool) {
	t.Helper()
	deadline := time.Now().Add(time.Minute)
	for !cond() {
		if time.Now().After(deadline) {
			t.Fatalf("timed out waiting for %s", what)
		}
		time.Sleep(20 * time.Millisecond)
	}
}

// Many renewals, concurrent, of many leases: each answered with its own
// lease's TTL, all on one etcd stream; a lease etcd does not have is
// ErrNotFound.
func TestRenewerOneStream(t *testing.T) {
	cli := etcdtest.Start(t, false).Client(t)
	ctx := context.Background()
	r := leasepool.NewRenewer(cli, nil)
	defer r.Close()
	const leases, rounds = 20, 5
	ids := make([]clientv3.LeaseID, leases)
	ttls := make([]int64, leases)
	for i := range leases {
		ttls[i] = int64(10 + i) // a distinct TTL each: an answer matched to the wrong caller shows
		g, err := cli.Grant(ctx, ttls[i])
		if err != nil {
			t.Fatal(err)
		}
		ids[i] = g.ID
	}
	before := etcdtest.KeepAliveStreams(t)
	var wg sync.WaitGroup
	errs := make(chan error, leases*rounds)
	for i := range leases {
		for range rounds {
			wg.Add(1)
			go func() {
				defer wg.Done()
				ttl, err := r.Renew(ctx, int64(ids[i]))
				if err == nil && ttl != ttls[i] {
					err = errors.New("wrong TTL")
				}
				if err != nil {
					errs <- err
				}
			}()
		}
	}
	wg.Wait()
	close(errs)
	for err := range errs {
		t.Fatal(err)
	}
	if _, err := cli.Revoke(ctx, ids[0]); err != nil {
		t.Fatal(err)
	}
	if _, err := r.Renew(ctx, int64(ids[0])); !errors.Is(err, leasepool.ErrNotFound) {
		t.Fatalf("renew a revoked lease: %v, want ErrNotFound", err)
	}
	if got := etcdtest.KeepAliveStreams(t) - before; got != 1 {
		t.Fatalf("%d renewals opened %v LeaseKeepAlive streams, want 1", leases*rounds+1, got)
	}
}

// A broken stream fails the renewals on it; the next renewal opens another.
func TestRenewerReopens(t *testing.T) {
	m := etcdtest.Start(t, false)
	proxy := etcdtest.NewProxy(t, m.ClientURL)
	cli, err := clientv3.New(clientv3.Config{Endpoints: []string{proxy.URL()}, DialTimeout: 5 * time.Second, Logger: etcdtest.QuietLogger()})
	if err != nil {
		t.Fatal(err)
	}
	defer cli.Close()
	ctx := context.Background()
	g, err := cli.Grant(ctx, 30)
	if err != nil {
		t.Fatal(err)
	}
	r := leasepool.NewRenewer(cli, nil)
	defer r.Close()
	if _, err := r.Renew(ctx, int64(g.ID)); err != nil {
		t.Fatal(err)
	}
	proxy.Cut()
	cctx, cancel := context.WithTimeout(ctx, 2*time.Second)
	_, err = r.Renew(cctx, int64(g.ID))
	cancel()
	if err == nil {
		t.Fatal("renewed through a cut link")
	}
	proxy.Heal()
	waitUntil(t, "a renewal after the link healed", func() bool {
		cctx, cancel := context.WithTimeout(ctx, 2*time.Second)
		defer cancel()
		ttl, err := r.Renew(cctx, int64(g.ID))
		return err == nil && ttl == 30
	})
}

// Close revokes the leases waiting in the pool, and only those: a lease
// handed out is its taker's.
func TestCloseRevokesIdleLeases(t *testing.T) {
	cli := etcdtest.Start(t, false).Client(t)
	ctx := context.Background()
	r := leasepool.NewRenewer(cli, nil)
	defer r.Close()
	cfg := leasepool.DefaultConfig()
	cfg.Client, cfg.Renewer, cfg.Size = cli, r, 4
	p, err := leasepool.New(cfg)
	if err != nil {
		t.Fatal(err)
	}
	taken, err := p.Take(ctx, 10*time.Second)
	if err != nil {
		t.Fatal(err)
	}
	waitUntil(t, "a full pool", func() bool { return p.Idle(10*time.Second) == 4 })
	ls, err := cli.Leases(ctx)
	if err != nil || len(ls.Leases) != 5 {
		t.Fatalf("leases before Close: %v (%v), want the taken one and 4 idle", ls.Leases, err)
	}
	if err := p.Close(ctx); err != nil {
		t.Fatal(err)
	}
	ls, err = cli.Leases(ctx)
	if err != nil || len(ls.Leases) != 1 || ls.Leases[0].ID != taken {
		t.Fatalf("leases after Close: %v (%v), want only the taken %x", ls.Leases, err, int64(taken))
	}
	if st := p.Stats(); st.Revoked != 4 {
		t.Fatalf("stats %+v: want 4 revoked", st)
	}
	// After Close a Take still works, granting on the spot.
	if _, err := p.Take(ctx, 10*time.Second); err != nil {
		t.Fatal(err)
	}
	if ls, err = cli.Leases(ctx); err != nil || len(ls.Leases) != 2 {
		t.Fatalf("leases after a Take past Close: %v (%v)", ls.Leases, err)
	}
}

// A pool keeps its idle leases alive past their TTL, on the Renewer's one
// stream, and hands them over refreshed.
func TestIdleLeasesKeptAlive(t *testing.T) {
	cli := etcdtest.Start(t, false).Client(t)
	ctx := context.Background()
	r := leasepool.NewRenewer(cli, nil)
	defer r.Close()
	cfg := leasepool.DefaultConfig()
	cfg.Client, cfg.Renewer, cfg.Size = cli, r, 2
	p, err := leasepool.New(cfg)
	if err != nil {
		t.Fatal(err)
	}
	defer p.Close(ctx)
	const ttl = 3 * time.Second
	taken, err := p.Take(ctx, ttl)
	if err != nil {
		t.Fatal(err)
	}
	waitUntil(t, "a full pool", func() bool { return p.Idle(ttl) == 2 })
	ls, err := cli.Leases(ctx)
	if err != nil {
		t.Fatal(err)
	}
	// Idle, the leases outlive their TTL twice over: renewed as they wait.
	start := time.Now()
	for time.Since(start) < 2*ttl {
		for _, l := range ls.Leases {
			if l.ID == taken {
				continue
			}
			tl, err := cli.TimeToLive(ctx, l.ID)
			if err != nil || tl.TTL == -1 {
				t.Fatalf("idle lease %x after %s: ttl %v, %v", int64(l.ID), time.Since(start), tl, err)
			}
		}
		time.Sleep(100 * time.Millisecond)
	}
	if st := p.Stats(); st.Expired != 0 {
		t.Fatalf("stats %+v: idle leases lapsed", st)
	}
	// Handed over, one comes with its full TTL (etcd reports whole
	// seconds, rounded down).
	id, err := p.Take(ctx, ttl)
	if err != nil {
		t.Fatal(err)
	}
	if tl, err := cli.TimeToLive(ctx, id); err != nil || id == taken || tl.TTL < 2 {
		t.Fatalf("taken lease %x: %v, %v", int64(id), tl, err)
	}
}
