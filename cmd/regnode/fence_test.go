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
	"sync/atomic"
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

// storedOwner is the regnode that wrote o-1's stored health.
func storedOwner(t *testing.T, rs []*regnodeProc, cli *clientv3.Client) *regnodeProc {
	t.Helper()
	observer := stored(t, cli).GetHealth().GetObserver()
	for _, r := range rs {
		if r.name == observer {
			return r
		}
	}
	t.Fatalf("o-1's health was written by %q, none of the regnodes", observer)
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

// staleWrites reads etcd's history of o-1 after revision from and returns
// the health writes made under a fence older than from: a membership (or
// leadership) that no longer held when they landed.
func staleWrites(t *testing.T, cli *clientv3.Client, from int64) (writes int, stale []string) {
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
				writes++
				if h.Fence < from {
					stale = append(stale, fmt.Sprintf("rev %d: %v by %s under fence %d", ev.Kv.ModRevision, h.State, h.Observer, h.Fence))
				}
				prev = h
			}
			if ev.Kv.ModRevision >= last {
				return writes, stale
			}
		}
	}
	t.Fatal("etcd's history of o-1 ended early")
	return 0, nil
}

// o-1's owner has its link to etcd paused (the process runs on and
// probes) and loses its share behind its back: its announcement goes, and
// another regnode takes o-1 over and writes the next transition. The old
// owner's own transition, due meanwhile, is sent into its paused link;
// when the link is back, it reaches etcd and the share's fence refuses it
// (its announcement is no longer held by the session it read). The key is
// deleted rather than left to expire, so that the session lives on and
// the write is tried. The regnode must count the refusal, and nothing
// written under its old share may be in etcd's history after the share
// moved (it announces itself again, and what it writes under its new
// share carries the new fence).
func TestPausedOwnerIsFenced(t *testing.T) {
	m := etcdtest.Start(t, false)
	cli := m.Client(t)
	// The TTL only bounds how long the pause may last before the old
	// owner's session gives up on its own (and writes nothing).
	rs := cluster(t, m.ClientURL, 3, "30s")
	tg := newTarget(t)
	register(t, rs, cli, tg)
	owner := storedOwner(t, rs, cli)

	owner.link.Pause()
	del, err := cli.Delete(context.Background(), record.DefaultPrefix+"nodes/"+owner.api)
	if err != nil || del.Deleted != 1 {
		t.Fatalf("take %s's announcement away: %v (deleted %d)", owner.name, err, del.Deleted)
	}
	moved := del.Header.Revision

	// A transition is due: the new owner writes it; the old one sends
	// its own into the paused link.
	errors0 := metric(t, owner, `registry_probes_total\{result="error"\}`)
	tg.down()
	var next string
	waitFor(t, 20*time.Second, "another regnode's DEGRADED in etcd", func() bool {
		h := stored(t, cli).GetHealth()
		next = h.GetObserver()
		return h.GetState() == registryv1.HealthState_HEALTH_STATE_DEGRADED && next != owner.name
	})
	waitFor(t, 20*time.Second, "the old owner to probe the down target", func() bool {
		return metric(t, owner, `registry_probes_total\{result="error"\}`) > errors0
	})
	if n := metric(t, owner, "registry_fence_rejections_total"); n != 0 {
		t.Fatalf("%d fence refusals while the old owner's link was paused", n)
	}
	owner.link.Resume()

	var refused int
	var stale []string
	waitFor(t, 30*time.Second, "the old owner's write to be refused or land", func() bool {
		refused = metric(t, owner, "registry_fence_rejections_total")
		_, stale = staleWrites(t, cli, moved)
		return refused > 0 || len(stale) > 0
	})
	if len(stale) > 0 {
		t.Fatalf("health written after o-1 moved to %s at revision %d under an older fence: %v", next, moved, stale)
	}
	// It announces itself again (its session lives), and probes again.
	waitFor(t, 20*time.Second, owner.name+" announced again", func() bool {
		resp, err := cli.Get(context.Background(), record.DefaultPrefix+"nodes/"+owner.api)
		return err == nil && len(resp.Kvs) == 1
	})
	writes, stale := staleWrites(t, cli, moved)
	if len(stale) > 0 || writes == 0 {
		t.Fatalf("after o-1 moved at %d: %d health writes, stale ones: %v", moved, writes, stale)
	}
	t.Logf("the old owner %s had %d writes refused by its share's fence; %d health writes after the move, none stale", owner.name, refused, writes)
}

// A killed regnode's share moves when its session expires: every instance
// it owned is probed by the others afterwards, and no instance changes
// state because of the move (etcd's history holds no health write). A
// graceful stop (SIGTERM) hands its share over at once: its announcement
// is gone when its process has exited.
func TestShareMovesOnKill(t *testing.T) {
	m := etcdtest.Start(t, false)
	cli := m.Client(t)
	rs := cluster(t, m.ClientURL, 3, "2s")
	c, err := client.New(client.Config{Endpoints: []string{rs[0].api, rs[1].api, rs[2].api}})
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	const n = 12
	targets := make([]*countingTarget, n)
	keys := record.NewKeys("")
	for i := range targets {
		targets[i] = newCountingTarget(t)
		if _, err := c.API().Register(context.Background(), &registryv1.RegisterRequest{Instance: &registryv1.Instance{
			Service: "orders", Id: fmt.Sprintf("o-%d", i), Address: targets[i].addr,
			Check: &registryv1.HealthCheck{Kind: registryv1.CheckKind_CHECK_KIND_TCP}}, Ttl: durationpbS(60)}); err != nil {
			t.Fatal(err)
		}
	}
	owners := map[string][]int{}
	var head int64
	waitFor(t, 30*time.Second, "every instance HEALTHY in etcd", func() bool {
		resp, err := cli.Get(context.Background(), keys.Instances(), clientv3.WithPrefix())
		if err != nil || len(resp.Kvs) != n {
			return false
		}
		clear(owners)
		for _, kv := range resp.Kvs {
			in, err := keys.Decode(string(kv.Key), kv.Value, kv.CreateRevision, kv.ModRevision)
			if err != nil || in.GetHealth().GetState() != registryv1.HealthState_HEALTH_STATE_HEALTHY {
				return false
			}
			var i int
			fmt.Sscanf(in.Id, "o-%d", &i)
			owners[in.Health.Observer] = append(owners[in.Health.Observer], i)
		}
		head = resp.Header.Revision
		return true
	})
	handover := func(sig syscall.Signal, victim *regnodeProc, rest []*regnodeProc) {
		t.Helper()
		mine := owners[victim.name]
		if err := victim.p.cmd.Process.Signal(sig); err != nil {
			t.Fatal(err)
		}
		if sig == syscall.SIGTERM {
			if code := victim.p.wait(t, 20*time.Second); code != 0 {
				t.Fatalf("%s exited %d after SIGTERM; stderr:\n%s", victim.name, code, victim.p.stderr)
			}
			if resp, err := cli.Get(context.Background(), record.DefaultPrefix+"nodes/"+victim.api); err != nil || len(resp.Kvs) != 0 {
				t.Fatalf("%s exited after SIGTERM with its announcement still in etcd (%v)", victim.name, err)
			}
		}
		waitFor(t, 30*time.Second, victim.name+"'s announcement to go", func() bool {
			resp, err := cli.Get(context.Background(), record.DefaultPrefix+"nodes/"+victim.api)
			return err == nil && len(resp.Kvs) == 0
		})
		before := make([]int64, n)
		for _, i := range mine {
			before[i] = targets[i].accepted.Load()
		}
		waitFor(t, 30*time.Second, fmt.Sprintf("the others to own all %d instances", n), func() bool {
			sum := 0
			for _, r := range rest {
				sum += metric(t, r, "registry_probe_owned_instances")
			}
			return sum == n
		})
		for _, i := range mine {
			waitFor(t, 30*time.Second, fmt.Sprintf("o-%d (%s's) probed by another regnode", i, victim.name), func() bool {
				return targets[i].accepted.Load() > before[i]
			})
		}
	}
	// The owned gauges follow the instances registered (not only the
	// membership): the three own the twelve between them.
	waitFor(t, 30*time.Second, fmt.Sprintf("the regnodes to own all %d instances", n), func() bool {
		sum := 0
		for _, r := range rs {
			sum += metric(t, r, "registry_probe_owned_instances")
		}
		return sum == n
	})
	victim := rs[0]
	for _, r := range rs {
		if len(owners[r.name]) > len(owners[victim.name]) {
			victim = r
		}
	}
	var rest []*regnodeProc
	for _, r := range rs {
		if r != victim {
			rest = append(rest, r)
		}
	}
	handover(syscall.SIGKILL, victim, rest)
	handover(syscall.SIGTERM, rest[0], rest[1:])
	// Nothing changed state: no health write since all were HEALTHY.
	resp, err := cli.Get(context.Background(), keys.Instances(), clientv3.WithPrefix())
	if err != nil {
		t.Fatal(err)
	}
	for _, kv := range resp.Kvs {
		if kv.ModRevision > head {
			in, _ := keys.Decode(string(kv.Key), kv.Value, kv.CreateRevision, kv.ModRevision)
			t.Fatalf("%s written at %d after the moves began (at %d): %v", kv.Key, kv.ModRevision, head, in.GetHealth())
		}
	}
	t.Logf("%s (killed) owned %v, %s (stopped) owned %v; the others took them over with no write", victim.name, owners[victim.name], rest[0].name, owners[rest[0].name])
}

// countingTarget is a TCP listener that counts the connections it
// accepted (each TCP probe is one).
type countingTarget struct {
	addr     string
	accepted atomic.Int64
}

func newCountingTarget(t *testing.T) *countingTarget {
	lis, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	ct := &countingTarget{addr: lis.Addr().String()}
	done := make(chan struct{})
	go func() {
		defer close(done)
		for {
			c, err := lis.Accept()
			if err != nil {
				return
			}
			ct.accepted.Add(1)
			c.Close()
		}
	}()
	t.Cleanup(func() { lis.Close(); <-done })
	return ct
}

func durationpbS(s int64) *durationpb.Duration { return &durationpb.Duration{Seconds: s} }

// o-1's owner is SIGSTOPped past its session TTL: its announcement
// expires, another regnode takes o-1 over and writes the next
// transition; then the stopped one runs again, with whatever it had in
// flight. Nothing it writes under its old share lands after the move
// (etcd's history), and it announces itself again.
func TestStoppedOwnerWritesNothingStale(t *testing.T) {
	m := etcdtest.Start(t, false)
	cli := m.Client(t)
	rs := cluster(t, m.ClientURL, 3, "2s")
	tg := newTarget(t)
	register(t, rs, cli, tg)
	owner := storedOwner(t, rs, cli)
	if err := owner.p.cmd.Process.Signal(syscall.SIGSTOP); err != nil {
		t.Fatal(err)
	}
	stopped := true
	defer func() {
		if stopped {
			owner.p.cmd.Process.Signal(syscall.SIGCONT)
		}
	}()
	var moved int64
	waitFor(t, 30*time.Second, owner.name+"'s announcement to expire", func() bool {
		resp, err := cli.Get(context.Background(), record.DefaultPrefix+"nodes/"+owner.api)
		moved = resp.Header.Revision
		return err == nil && len(resp.Kvs) == 0
	})
	tg.down()
	waitFor(t, 30*time.Second, "another regnode's DEGRADED in etcd", func() bool {
		h := stored(t, cli).GetHealth()
		return h.GetState() == registryv1.HealthState_HEALTH_STATE_DEGRADED && h.GetObserver() != owner.name
	})
	if err := owner.p.cmd.Process.Signal(syscall.SIGCONT); err != nil {
		t.Fatal(err)
	}
	stopped = false
	waitFor(t, 30*time.Second, owner.name+" announced again", func() bool {
		resp, err := cli.Get(context.Background(), record.DefaultPrefix+"nodes/"+owner.api)
		return err == nil && len(resp.Kvs) == 1
	})
	// It probes again (its share back or not), and nothing stale landed.
	n0 := probes(t, owner)
	waitFor(t, 30*time.Second, owner.name+" running again", func() bool { return probes(t, owner) > n0 || metric(t, owner, "registry_probe_owned_instances") == 0 })
	writes, stale := staleWrites(t, cli, moved)
	if len(stale) > 0 || writes == 0 {
		t.Fatalf("after o-1 moved at %d: %d health writes, stale ones: %v", moved, writes, stale)
	}
}
