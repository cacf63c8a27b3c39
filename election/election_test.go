package election_test

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	clientv3 "go.etcd.io/etcd/client/v3"
	"go.uber.org/goleak"

	"github.com/regcluster/registry/election"
	"github.com/regcluster/registry/internal/etcdtest"
)

func TestMain(m *testing.M) { goleak.VerifyTestMain(m, etcdtest.LeakOptions()...) }

func waitFor(t *testing.T, d time.Duration, what string, cond func() bool) {
	t.Helper()
	deadline := time.Now().Add(d)
	for !cond() {
		if time.Now().After(deadline) {
			t.Fatalf("timed out after %s waiting for %s", d, what)
		}
		time.Sleep(20 * time.Millisecond)
	}
}

// candidate runs one Election whose lead work records its leadership and
// blocks until its ctx ends.
type candidate struct {
	name    string
	leading atomic.Pointer[election.Leadership]
	terms   atomic.Int64
	cancel  context.CancelFunc
	done    chan error
}

func run(t *testing.T, cli *clientv3.Client, name string, lead election.Lead) *candidate {
	t.Helper()
	c := &candidate{name: name, done: make(chan error, 1)}
	e, err := election.New(election.Config{Client: cli, Name: name, SessionTTL: 2 * time.Second})
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	c.cancel = cancel
	if lead == nil {
		lead = func(ctx context.Context, l *election.Leadership) error {
			c.terms.Add(1)
			c.leading.Store(l)
			<-ctx.Done()
			c.leading.Store(nil)
			return ctx.Err()
		}
	}
	go func() { c.done <- e.Run(ctx, lead) }()
	t.Cleanup(c.stop)
	return c
}

func (c *candidate) stop() {
	if c.cancel != nil {
		c.cancel()
		<-c.done
		c.cancel = nil
	}
}

// watchers is how many watches the etcd members in this process serve.
func watchers(t *testing.T) float64 {
	t.Helper()
	mfs, err := prometheus.DefaultGatherer.Gather()
	if err != nil {
		t.Fatal(err)
	}
	for _, mf := range mfs {
		if mf.GetName() == "etcd_debugging_mvcc_watcher_total" {
			return mf.GetMetric()[0].GetGauge().GetValue()
		}
	}
	t.Fatal("etcd exports no etcd_debugging_mvcc_watcher_total")
	return 0
}

// One leads; a second candidate waits in Campaign, on a watch of the
// leader's key; stopping the leader hands over at once (its Run returns only
// once it resigned, so its key is gone by then, not a session TTL later);
// observers see who leads.
func TestOneLeaderAndImmediateHandover(t *testing.T) {
	m := etcdtest.Start(t, false)
	cli := m.Client(t)
	a := run(t, cli, "a", nil)
	waitFor(t, 5*time.Second, "a to lead", func() bool { return a.leading.Load() != nil })
	w0 := watchers(t)
	b := run(t, cli, "b", nil)
	waitFor(t, 10*time.Second, "b to wait on the leader's key", func() bool { return watchers(t) > w0 })
	if b.leading.Load() != nil {
		t.Fatal("two leaders")
	}
	l, err := election.CurrentLeader(context.Background(), cli, "")
	if err != nil || l.Name != "a" || l.Rev != a.leading.Load().Rev || l.Since.IsZero() {
		t.Fatalf("leader = %+v, %v", l, err)
	}
	a.stop()
	if l, err := election.CurrentLeader(context.Background(), cli, ""); err == nil && l.Name == "a" {
		t.Fatalf("a's Run returned with its key still in etcd (fence %d): it did not resign", l.Rev)
	}
	waitFor(t, 10*time.Second, "b to lead", func() bool { return b.leading.Load() != nil })
	l, err = election.CurrentLeader(context.Background(), cli, "")
	if err != nil || l.Name != "b" || l.Rev != b.leading.Load().Rev {
		t.Fatalf("leader = %+v, %v", l, err)
	}
	if a.terms.Load() != 1 || b.terms.Load() != 1 {
		t.Fatalf("terms: a %d, b %d; want one each", a.terms.Load(), b.terms.Load())
	}
	b.stop()
	if _, err := election.CurrentLeader(context.Background(), cli, ""); !errors.Is(err, election.ErrNoLeader) {
		t.Fatalf("after both stopped: %v", err)
	}
}

// A leader deposed behind its back (its session lease revoked, as when it
// is paused past the TTL) cannot write through its fence; its lead work
// ends and it campaigns again, with a new fence.
func TestDeposedLeaderIsFenced(t *testing.T) {
	m := etcdtest.Start(t, false)
	cli := m.Client(t)
	var (
		mu      sync.Mutex
		fences  []int64
		refused atomic.Int64
	)
	lead := func(ctx context.Context, l *election.Leadership) error {
		mu.Lock()
		fences = append(fences, l.Rev)
		first := len(fences) == 1
		mu.Unlock()
		if first {
			// Depose ourselves: revoke the session's lease.
			resp, err := cli.Get(ctx, l.Key)
			if err != nil || len(resp.Kvs) == 0 {
				return err
			}
			if _, err := cli.Revoke(ctx, clientv3.LeaseID(resp.Kvs[0].Lease)); err != nil {
				return err
			}
			tx, err := cli.Txn(context.Background()).If(l.Fence()).Then(clientv3.OpPut("/fenced-write", "stale")).Commit()
			if err != nil {
				return err
			}
			if tx.Succeeded {
				t.Error("a deposed leader's fenced write landed")
			}
			refused.Add(1)
			return election.ErrFenced
		}
		<-ctx.Done()
		return ctx.Err()
	}
	c := run(t, cli, "a", lead)
	waitFor(t, 10*time.Second, "a second term", func() bool {
		mu.Lock()
		defer mu.Unlock()
		return len(fences) == 2
	})
	mu.Lock()
	if fences[1] <= fences[0] {
		t.Fatalf("fences %v: the new term must have a newer fence", fences)
	}
	mu.Unlock()
	if refused.Load() != 1 {
		t.Fatal("the stale write was not attempted")
	}
	resp, err := cli.Get(context.Background(), "/fenced-write")
	if err != nil {
		t.Fatal(err)
	}
	if len(resp.Kvs) != 0 {
		t.Fatal("the fenced write is in etcd")
	}
	c.stop()
}

// When the session expires under a leader (keepalives stop reaching etcd
// for longer than the TTL), its lead ctx ends.
func TestLeadEndsWhenSessionExpires(t *testing.T) {
	m := etcdtest.Start(t, false)
	p := etcdtest.NewProxy(t, m.ClientURL)
	cli, err := clientv3.New(clientv3.Config{Endpoints: []string{p.URL()}, DialTimeout: time.Second, Logger: etcdtest.QuietLogger()})
	if err != nil {
		t.Fatal(err)
	}
	defer cli.Close()
	ended := make(chan time.Time, 4)
	leading := make(chan struct{}, 4)
	lead := func(ctx context.Context, l *election.Leadership) error {
		leading <- struct{}{}
		<-ctx.Done()
		ended <- time.Now()
		return ctx.Err()
	}
	observer := m.Client(t)
	c := run(t, cli, "a", lead)
	select { // leading, not merely holding a key in etcd
	case <-leading:
	case <-time.After(10 * time.Second):
		t.Fatal("a never led")
	}
	p.Pause() // the leader's keepalives stop reaching etcd
	cut := time.Now()
	waitFor(t, 10*time.Second, "the leader key to expire", func() bool {
		_, err := election.CurrentLeader(context.Background(), observer, "")
		return errors.Is(err, election.ErrNoLeader)
	})
	p.Cut() // break the paused connections so the client notices
	p.Heal()
	select {
	case at := <-ended:
		t.Logf("lead ended %s after the link was paused (session TTL 2s)", at.Sub(cut).Round(time.Millisecond))
	case <-time.After(15 * time.Second):
		t.Fatal("lead did not end after its session expired")
	}
	c.stop()
}

// A stop while etcd cannot be reached ends Run: the session's lease grant
// waits under Run's context, not for as long as the etcd client lives.
// The client here points at a port nothing listens on, so every call
// waits for a connection that never comes.
func TestRunStopsWhileEtcdUnreachable(t *testing.T) {
	cli, err := clientv3.New(clientv3.Config{
		Endpoints: []string{fmt.Sprintf("127.0.0.1:%d", etcdtest.FreePort(t))},
		Logger:    etcdtest.QuietLogger(),
	})
	if err != nil {
		t.Fatal(err)
	}
	defer cli.Close()
	e, err := election.New(election.Config{Client: cli, Name: "a", SessionTTL: 2 * time.Second})
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() {
		done <- e.Run(ctx, func(context.Context, *election.Leadership) error {
			t.Error("led without etcd")
			return nil
		})
	}()
	cancel()
	select {
	case err := <-done:
		if !errors.Is(err, context.Canceled) {
			t.Fatalf("Run returned %v, want context.Canceled", err)
		}
	case <-time.After(time.Minute): // a guard against a hang, not a timing assertion
		t.Fatal("Run did not return after its context was cancelled while etcd was unreachable")
	}
}
