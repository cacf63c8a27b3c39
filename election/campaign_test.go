package election_test

import (
	"context"
	"fmt"
	"sync"
	"testing"
	"time"

	clientv3 "go.etcd.io/etcd/client/v3"

	"github.com/regcluster/registry/election"
	"github.com/regcluster/registry/internal/etcdtest"
	"github.com/regcluster/registry/record"
)

// guarded is a candidate's lead work that checks, before anything else,
// that the key it leads under is alive in etcd (read through observer, not
// the candidate's own link), and records every term.
type guarded struct {
	mu     sync.Mutex
	fences []int64
	dead   []string // terms that began under a key etcd no longer held
}

func (g *guarded) lead(observer *clientv3.Client) election.Lead {
	return func(ctx context.Context, l *election.Leadership) error {
		held, err := l.Held(context.Background(), observer)
		g.mu.Lock()
		g.fences = append(g.fences, l.Rev)
		if err != nil || !held {
			g.dead = append(g.dead, fmt.Sprintf("fence %d (held %v, err %v)", l.Rev, held, err))
		}
		g.mu.Unlock()
		<-ctx.Done()
		return ctx.Err()
	}
}

func (g *guarded) terms() ([]int64, []string) {
	g.mu.Lock()
	defer g.mu.Unlock()
	return append([]int64(nil), g.fences...), append([]string(nil), g.dead...)
}

// candidateKey waits until a candidate other than the leader (whose key
// was created at leaderRev) holds a key under the election prefix, and
// returns that key.
func candidateKey(t *testing.T, cli *clientv3.Client, leaderRev int64) (key string, rev int64, lease clientv3.LeaseID) {
	t.Helper()
	waitFor(t, 10*time.Second, "the second candidate's key", func() bool {
		resp, err := cli.Get(context.Background(), record.NewKeys("").Election()+"/", clientv3.WithPrefix())
		if err != nil {
			t.Fatal(err)
		}
		for _, kv := range resp.Kvs {
			if kv.CreateRevision != leaderRev {
				key, rev, lease = string(kv.Key), kv.CreateRevision, clientv3.LeaseID(kv.Lease)
				return true
			}
		}
		return false
	})
	return key, rev, lease
}

// A candidate whose key vanishes while it waits in Campaign (its lease ran
// out in etcd before its session heard, or an operator deleted it) is told
// it won when the leader steps down: etcd's Campaign does not look at its
// own key again. It must not lead on that key; it campaigns again and
// leads under a live one.
func TestNoLeadOnKeyLostWhileCampaigning(t *testing.T) {
	m := etcdtest.Start(t, false)
	cli := m.Client(t)
	observer := m.Client(t)
	a := run(t, cli, "a", nil)
	waitFor(t, 5*time.Second, "a to lead", func() bool { return a.leading.Load() != nil })
	var g guarded
	run(t, cli, "b", g.lead(observer))
	key, rev, _ := candidateKey(t, observer, a.leading.Load().Rev)
	// b's session is alive and says nothing: only its key is gone.
	if d, err := observer.Delete(context.Background(), key); err != nil || d.Deleted != 1 {
		t.Fatalf("delete b's key: %v", err)
	}
	a.stop() // b's Campaign now returns, holding nothing
	waitFor(t, 15*time.Second, "b to lead", func() bool {
		fences, _ := g.terms()
		return len(fences) > 0
	})
	fences, dead := g.terms()
	if len(dead) > 0 || fences[0] == rev {
		t.Fatalf("b led under a key etcd no longer held: %v (all terms %v)", dead, fences)
	}
	if l, err := election.CurrentLeader(context.Background(), observer, ""); err != nil || l.Name != "b" || l.Rev != fences[len(fences)-1] {
		t.Fatalf("leader = %+v, %v; b leads under fence %d", l, err, fences[len(fences)-1])
	}
}

// A candidate whose session expires while it waits in Campaign (its link
// to etcd paused past the TTL): once its link is back, it gives up that
// campaign and stands again under a new session while the leader still
// leads, and when the leader steps down it leads under the new key, never
// on the expired one.
func TestNoLeadOnSessionExpiredWhileCampaigning(t *testing.T) {
	m := etcdtest.Start(t, false)
	observer := m.Client(t)
	p := etcdtest.NewProxy(t, m.ClientURL)
	bcli, err := clientv3.New(clientv3.Config{Endpoints: []string{p.URL()}, DialTimeout: time.Second, Logger: etcdtest.QuietLogger()})
	if err != nil {
		t.Fatal(err)
	}
	defer bcli.Close()
	a := run(t, observer, "a", nil)
	waitFor(t, 5*time.Second, "a to lead", func() bool { return a.leading.Load() != nil })
	var g guarded
	b := run(t, bcli, "b", g.lead(observer))
	key, rev, lease := candidateKey(t, observer, a.leading.Load().Rev)
	p.Pause()
	waitFor(t, 15*time.Second, "b's session lease to expire in etcd", func() bool {
		ttl, err := observer.TimeToLive(context.Background(), lease)
		return err == nil && ttl.TTL == -1
	})
	if resp, err := observer.Get(context.Background(), key); err != nil || len(resp.Kvs) != 0 {
		t.Fatalf("b's key %s outlived its lease: %v", key, err)
	}
	p.Resume()
	// Still a candidate: a new key, under a new lease, behind a's.
	_, rev2, lease2 := candidateKey(t, observer, a.leading.Load().Rev)
	if lease2 == lease || rev2 <= rev {
		t.Fatalf("b stands again under lease %x (key rev %d), its expired one was %x (rev %d)", lease2, rev2, lease, rev)
	}
	if fences, _ := g.terms(); len(fences) != 0 {
		t.Fatalf("b led while a still led: terms %v", fences)
	}
	a.stop()
	waitFor(t, 20*time.Second, "b to lead", func() bool {
		fences, _ := g.terms()
		return len(fences) > 0
	})
	fences, dead := g.terms()
	if len(dead) > 0 || fences[0] != rev2 {
		t.Fatalf("b led under fence %d, want its live key's %d (expired %d): dead terms %v", fences[0], rev2, rev, dead)
	}
	b.stop()
}
