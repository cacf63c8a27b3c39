package main_test

import (
	"context"
	"fmt"
	"io"
	"net"
	"net/http"
	"regexp"
	"strconv"
	"sync"
	"syscall"
	"testing"
	"time"

	clientv3 "go.etcd.io/etcd/client/v3"
	"google.golang.org/protobuf/proto"
	"google.golang.org/protobuf/types/known/durationpb"

	"github.com/regcluster/registry/client"
	"github.com/regcluster/registry/election"
	"github.com/regcluster/registry/internal/etcdtest"
	registryv1 "github.com/regcluster/registry/proto/registry/v1"
	"github.com/regcluster/registry/record"
)

// regnodeProc is one regnode process of a cluster on a shared etcd,
// reaching it through its own link.
type regnodeProc struct {
	name, api, metrics string
	p                  *proc
	link               *etcdtest.Proxy // this regnode's link to etcd
}

// cluster starts n regnode processes on the etcd at etcdURL, each through
// its own proxy, with the given session TTL and 100ms probes, and waits
// until all serve.
func cluster(t *testing.T, etcdURL string, n int, sessionTTL string) []*regnodeProc {
	t.Helper()
	var out []*regnodeProc
	for i := range n {
		r := &regnodeProc{name: fmt.Sprintf("r%d", i+1),
			api:     fmt.Sprintf("127.0.0.1:%d", etcdtest.FreePort(t)),
			metrics: fmt.Sprintf("127.0.0.1:%d", etcdtest.FreePort(t)),
			link:    etcdtest.NewProxy(t, etcdURL)}
		r.p = start(t, map[string]string{
			"REGNODE_ETCD_ENDPOINTS": r.link.URL(), "REGNODE_NAME": r.name, "REGNODE_LISTEN": r.api,
			"REGNODE_METRICS_LISTEN": r.metrics, "REGNODE_SESSION_TTL": sessionTTL, "REGNODE_PROBE_INTERVAL": "100ms",
			"REGNODE_LOG_LEVEL": "warn"})
		out = append(out, r)
	}
	for _, r := range out {
		waitServing(t, dial(t, r.api), r.p)
	}
	return out
}

func leader(t *testing.T, cli *clientv3.Client) (election.Leader, bool) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Second)
	defer cancel()
	l, err := election.CurrentLeader(ctx, cli, "")
	return l, err == nil
}

func byName(rs []*regnodeProc, name string) *regnodeProc {
	for _, r := range rs {
		if r.name == name {
			return r
		}
	}
	return nil
}

// probes is the regnode's total of probes run, from /metrics.
func probes(t *testing.T, r *regnodeProc) int {
	t.Helper()
	return metric(t, r, `registry_probes_total\{result="[a-z]+"\}`)
}

// metric sums the samples of the series matching pattern on r's /metrics.
func metric(t *testing.T, r *regnodeProc, pattern string) int {
	t.Helper()
	metricLine := regexp.MustCompile(`(?m)^` + pattern + ` (\d+)$`)
	resp, err := http.Get("http://" + r.metrics + "/metrics")
	if err != nil {
		t.Fatalf("metrics of %s: %v", r.name, err)
	}
	defer resp.Body.Close()
	body, err := io.ReadAll(resp.Body)
	if err != nil {
		t.Fatalf("metrics of %s: %v", r.name, err)
	}
	n := 0
	for _, m := range metricLine.FindAllStringSubmatch(string(body), -1) {
		v, err := strconv.Atoi(m[1])
		if err != nil {
			t.Fatalf("metrics of %s: %q: %v", r.name, m[0], err)
		}
		n += v
	}
	return n
}

// target is a TCP listener the test can take down and bring back.
type target struct {
	addr string
	mu   sync.Mutex
	lis  net.Listener
}

func newTarget(t *testing.T) *target {
	lis, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	tg := &target{addr: lis.Addr().String()}
	tg.serve(lis)
	t.Cleanup(tg.down)
	return tg
}

func (tg *target) serve(lis net.Listener) {
	tg.mu.Lock()
	tg.lis = lis
	tg.mu.Unlock()
	go func() {
		for {
			c, err := lis.Accept()
			if err != nil {
				return
			}
			c.Close()
		}
	}()
}

func (tg *target) down() {
	tg.mu.Lock()
	defer tg.mu.Unlock()
	if tg.lis != nil {
		tg.lis.Close()
		tg.lis = nil
	}
}

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

// stored reads o-1's record from etcd itself (a regnode's view may lag).
func stored(t *testing.T, cli *clientv3.Client) *registryv1.Instance {
	t.Helper()
	keys := record.NewKeys("")
	resp, err := cli.Get(context.Background(), keys.Instance("orders", "o-1"))
	if err != nil {
		t.Fatal(err)
	}
	if len(resp.Kvs) != 1 {
		t.Fatal("o-1 is not in etcd")
	}
	kv := resp.Kvs[0]
	in, err := keys.Decode(string(kv.Key), kv.Value, kv.CreateRevision, kv.ModRevision)
	if err != nil {
		t.Fatal(err)
	}
	return in
}

// register puts o-1 with a TCP check on tg (one failure is a transition)
// and waits until etcd holds it HEALTHY.
func register(t *testing.T, rs []*regnodeProc, cli *clientv3.Client, tg *target) {
	t.Helper()
	c, err := client.New(client.Config{Endpoints: []string{rs[0].api, rs[1].api, rs[2].api}})
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	if _, err := c.API().Register(context.Background(), &registryv1.RegisterRequest{Instance: &registryv1.Instance{
		Service: "orders", Id: "o-1", Address: tg.addr, Check: &registryv1.HealthCheck{Kind: registryv1.CheckKind_CHECK_KIND_TCP,
			FailuresToDegraded: 1}},
		Ttl: durationpbS(60)}); err != nil {
		t.Fatal(err)
	}
	waitFor(t, 30*time.Second, "o-1 HEALTHY in etcd", func() bool {
		return stored(t, cli).GetHealth().GetState() == registryv1.HealthState_HEALTH_STATE_HEALTHY
	})
}

// healthWrites reads etcd's history of o-1 after revision from: the health
// writes made by name under fence, and those made by anyone else.
func healthWrites(t *testing.T, cli *clientv3.Client, from int64, name string, fence int64) (mine int, others []string) {
	t.Helper()
	keys := record.NewKeys("")
	key := keys.Instance("orders", "o-1")
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	head, err := cli.Get(ctx, key)
	if err != nil {
		t.Fatal(err)
	}
	if len(head.Kvs) != 1 {
		t.Fatal("o-1 is not in etcd")
	}
	last := head.Kvs[0].ModRevision // read up to o-1's latest write
	if last <= from {
		return 0, nil
	}
	var prev *registryv1.Health
	for resp := range cli.Watch(ctx, key, clientv3.WithRev(from+1)) {
		if err := resp.Err(); err != nil {
			t.Fatalf("history of o-1: %v", err)
		}
		for _, ev := range resp.Events {
			if ev.Type == clientv3.EventTypeDelete {
				t.Fatalf("o-1 deleted at %d", ev.Kv.ModRevision)
			}
			in, err := keys.Decode(key, ev.Kv.Value, ev.Kv.CreateRevision, ev.Kv.ModRevision)
			if err != nil {
				t.Fatal(err)
			}
			if h := in.Health; h != nil && !proto.Equal(h, prev) {
				if h.Observer == name && h.Fence == fence {
					mine++
				} else {
					others = append(others, fmt.Sprintf("rev %d: %v by %s under fence %d", ev.Kv.ModRevision, h.State, h.Observer, h.Fence))
				}
				prev = h
			}
			if ev.Kv.ModRevision >= last {
				return mine, others
			}
		}
	}
	t.Fatal("etcd's history of o-1 ended early")
	return 0, nil
}

// The leader's link to etcd is paused (the process runs on and probes) and
// it is deposed behind its back: its election key goes, another regnode
// takes over and writes the next transition. The old leader's own
// transition, due meanwhile, is sent into its paused link; when the link
// is back, it reaches etcd and the fence refuses it. Its key is deleted
// rather than left to expire: an expired lease would be reported to its
// session by the first keepalive answer after the pause, ahead of its
// write, and the prober would stop before writing, so the fence would never
// be tried (the run that found 0 refusals). The regnode must count the
// refusal, nothing it sent may be in etcd's history after the takeover,
// and it must stop probing.
func TestPausedLeaderIsFenced(t *testing.T) {
	m := etcdtest.Start(t, false)
	cli := m.Client(t)
	// The TTL only bounds how long the pause may last before the old
	// leader's session gives up on its own (and writes nothing).
	rs := cluster(t, m.ClientURL, 3, "30s")
	tg := newTarget(t)
	register(t, rs, cli, tg)
	old, ok := leader(t, cli)
	if !ok {
		t.Fatal("no leader")
	}
	oldProc := byName(rs, old.Name)

	oldProc.link.Pause()
	resp, err := cli.Get(context.Background(), record.NewKeys("").Election()+"/", clientv3.WithPrefix())
	if err != nil {
		t.Fatal(err)
	}
	var oldKey string
	for _, kv := range resp.Kvs {
		if kv.CreateRevision == old.Rev {
			oldKey = string(kv.Key)
		}
	}
	del, err := cli.Txn(context.Background()).If(clientv3.Compare(clientv3.CreateRevision(oldKey), "=", old.Rev)).
		Then(clientv3.OpDelete(oldKey)).Commit()
	if err != nil || !del.Succeeded {
		t.Fatalf("depose %s (key %q): %v", old.Name, oldKey, err)
	}
	takeover := del.Header.Revision
	var next election.Leader
	waitFor(t, 20*time.Second, "another regnode to lead", func() bool {
		l, ok := leader(t, cli)
		next = l
		return ok && l.Name != old.Name
	})
	nextProc := byName(rs, next.Name)

	// A transition is due: the new leader writes it; the old one sends
	// its own into the paused link.
	errors0 := metric(t, oldProc, `registry_probes_total\{result="error"\}`)
	tg.down()
	waitFor(t, 20*time.Second, "the new leader's DEGRADED in etcd", func() bool {
		h := stored(t, cli).GetHealth()
		return h.GetState() == registryv1.HealthState_HEALTH_STATE_DEGRADED && h.GetObserver() == next.Name
	})
	waitFor(t, 20*time.Second, "the old leader to probe the down target", func() bool {
		return metric(t, oldProc, `registry_probes_total\{result="error"\}`) > errors0
	})
	if n := metric(t, oldProc, "registry_fence_rejections_total"); n != 0 {
		t.Fatalf("%d fence refusals while the old leader's link was paused", n)
	}
	oldProc.link.Resume()

	// Refused (counted by the old leader) and not landed (etcd's history).
	var refused int
	var stale []string
	waitFor(t, 30*time.Second, "the old leader's write to be refused or land", func() bool {
		refused = metric(t, oldProc, "registry_fence_rejections_total")
		_, stale = healthWrites(t, cli, takeover, next.Name, next.Rev)
		return refused > 0 || len(stale) > 0
	})
	if len(stale) > 0 {
		t.Fatalf("health written after %s took over at revision %d by someone else: %v", next.Name, takeover, stale)
	}
	waitFor(t, 20*time.Second, "the old leader to stop leading", func() bool {
		return metric(t, oldProc, "registry_prober_leader") == 0
	})
	// It no longer probes: while the new leader runs 20 more probes, the
	// old leader's count stays where it stopped.
	stopped, n0 := probes(t, oldProc), probes(t, nextProc)
	waitFor(t, 20*time.Second, "20 more probes by the new leader", func() bool { return probes(t, nextProc) >= n0+20 })
	if after := probes(t, oldProc); after != stopped {
		t.Fatalf("the deposed leader %s still probes: %d probes while the new leader ran 20", old.Name, after-stopped)
	}
	mine, stale := healthWrites(t, cli, takeover, next.Name, next.Rev)
	if len(stale) > 0 || mine == 0 {
		t.Fatalf("after the takeover at %d: %d writes by %s, and by others: %v", takeover, mine, next.Name, stale)
	}
	if l, ok := leader(t, cli); !ok || l.Name != next.Name || l.Rev != next.Rev {
		t.Fatalf("leader = %+v, want %s under fence %d", l, next.Name, next.Rev)
	}
	t.Logf("the old leader %s had %d writes refused by the fence; %d health writes by %s after the takeover, none by anyone else",
		old.Name, refused, mine, next.Name)
}

// A graceful stop (SIGTERM) hands probing over by resigning: the old
// leader's key is already gone when its process has exited. A kill
// (SIGKILL) hands it over when the session lease expires: no one else
// leads while it lives.
func TestProberFailover(t *testing.T) {
	m := etcdtest.Start(t, false)
	cli := m.Client(t)
	rs := cluster(t, m.ClientURL, 3, "2s")
	tg := newTarget(t)
	register(t, rs, cli, tg)

	// handover signals the leader and waits until another regnode probes.
	handover := func(sig syscall.Signal) (old, next election.Leader) {
		t.Helper()
		old, ok := leader(t, cli)
		if !ok {
			t.Fatal("no leader")
		}
		p := byName(rs, old.Name)
		if err := p.p.cmd.Process.Signal(sig); err != nil {
			t.Fatal(err)
		}
		if sig == syscall.SIGTERM {
			if code := p.p.wait(t, 20*time.Second); code != 0 {
				t.Fatalf("%s exited %d after SIGTERM; stderr:\n%s", old.Name, code, p.p.stderr)
			}
			resp, err := cli.Get(context.Background(), record.NewKeys("").Election()+"/", clientv3.WithPrefix())
			if err != nil {
				t.Fatal(err)
			}
			for _, kv := range resp.Kvs {
				if kv.CreateRevision == old.Rev {
					t.Fatalf("%s exited after SIGTERM with its leader key still in etcd: it did not resign", old.Name)
				}
			}
		}
		waitFor(t, 30*time.Second, fmt.Sprintf("another regnode to lead after %v to %s", sig, old.Name), func() bool {
			l, ok := leader(t, cli)
			next = l
			return ok && l.Name != old.Name
		})
		np := byName(rs, next.Name)
		n0 := probes(t, np)
		waitFor(t, 30*time.Second, next.Name+" to probe", func() bool { return probes(t, np) > n0 })
		return old, next
	}
	handover(syscall.SIGTERM)
	old, next := handover(syscall.SIGKILL)
	// The killed leader's key went with its lease, not before: the
	// election's leader changed only once etcd had expired it.
	ttl, err := cli.TimeToLive(context.Background(), clientv3.LeaseID(leaseOf(t, cli, old.Rev)))
	if err != nil {
		t.Fatal(err)
	}
	if ttl.TTL != -1 {
		t.Fatalf("%s leads while the killed leader's lease still has %ds", next.Name, ttl.TTL)
	}
}

// leaseOf reads, at revision rev, the lease of the election key created
// there.
func leaseOf(t *testing.T, cli *clientv3.Client, rev int64) int64 {
	t.Helper()
	resp, err := cli.Get(context.Background(), record.NewKeys("").Election()+"/", clientv3.WithPrefix(), clientv3.WithRev(rev))
	if err != nil {
		t.Fatal(err)
	}
	for _, kv := range resp.Kvs {
		if kv.CreateRevision == rev {
			return kv.Lease
		}
	}
	t.Fatalf("no election key created at %d", rev)
	return 0
}

func durationpbS(s int64) *durationpb.Duration { return &durationpb.Duration{Seconds: s} }
