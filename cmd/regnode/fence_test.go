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
	"google.golang.org/protobuf/types/known/durationpb"

	"github.com/regcluster/registry/client"
	"github.com/regcluster/registry/election"
	"github.com/regcluster/registry/internal/etcdtest"
	registryv1 "github.com/regcluster/registry/proto/registry/v1"
	"github.com/regcluster/registry/record"
)

// regnodeProc is one regnode process of a cluster on a shared etcd.
type regnodeProc struct {
	name, api, metrics string
	p                  *proc
}

// cluster starts n regnode processes on the etcd at etcdURL, with a 2s
// session TTL and 100ms probes, and waits until all serve.
func cluster(t *testing.T, etcdURL string, n int) []*regnodeProc {
	t.Helper()
	var out []*regnodeProc
	for i := range n {
		r := &regnodeProc{name: fmt.Sprintf("r%d", i+1),
			api:     fmt.Sprintf("127.0.0.1:%d", etcdtest.FreePort(t)),
			metrics: fmt.Sprintf("127.0.0.1:%d", etcdtest.FreePort(t))}
		r.p = start(t, map[string]string{
			"REGNODE_ETCD_ENDPOINTS": etcdURL, "REGNODE_NAME": r.name, "REGNODE_LISTEN": r.api,
			"REGNODE_METRICS_LISTEN": r.metrics, "REGNODE_SESSION_TTL": "2s", "REGNODE_PROBE_INTERVAL": "100ms",
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
	metricLine := regexp.MustCompile(`(?m)^` + pattern + ` (\d+)`)
	resp, err := http.Get("http://" + r.metrics + "/metrics")
	if err != nil {
		t.Fatalf("metrics of %s: %v", r.name, err)
	}
	defer resp.Body.Close()
	body, _ := io.ReadAll(resp.Body)
	n := 0
	for _, m := range metricLine.FindAllStringSubmatch(string(body), -1) {
		v, _ := strconv.Atoi(m[1])
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

func (tg *target) up(t *testing.T) {
	lis, err := net.Listen("tcp", tg.addr)
	if err != nil {
		t.Fatal(err)
	}
	tg.serve(lis)
}

func awaitHealth(t *testing.T, api registryv1.RegistryClient, state registryv1.HealthState, d time.Duration) *registryv1.Health {
	t.Helper()
	deadline := time.Now().Add(d)
	for time.Now().Before(deadline) {
		ctx, cancel := context.WithTimeout(context.Background(), time.Second)
		g, err := api.Get(ctx, &registryv1.GetRequest{Service: "orders", Id: "o-1"})
		cancel()
		if err == nil && g.Instance.GetHealth().GetState() == state {
			return g.Instance.Health
		}
		time.Sleep(50 * time.Millisecond)
	}
	t.Fatalf("o-1 did not reach %v within %s", state, d)
	return nil
}

// The leading regnode is paused (SIGSTOP) past its session TTL; another
// takes over and probes; the old one is resumed and not one of its writes
// lands (etcd's history of the key proves it), and it stops probing.
func TestPausedLeaderIsFenced(t *testing.T) {
	m := etcdtest.Start(t, false)
	cli := m.Client(t)
	rs := cluster(t, m.ClientURL, 3)
	tg := newTarget(t)
	c, err := client.New(client.Config{Endpoints: []string{rs[0].api, rs[1].api, rs[2].api}})
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	api := c.API()
	if _, err := api.Register(context.Background(), &registryv1.RegisterRequest{Instance: &registryv1.Instance{
		Service: "orders", Id: "o-1", Address: tg.addr, Check: &registryv1.HealthCheck{Kind: registryv1.CheckKind_CHECK_KIND_TCP,
			FailuresToDegraded: 1}},
		Ttl: durationpbS(60)}); err != nil {
		t.Fatal(err)
	}
	awaitHealth(t, api, registryv1.HealthState_HEALTH_STATE_HEALTHY, 20*time.Second)
	old, ok := leader(t, cli)
	if !ok {
		t.Fatal("no leader")
	}
	oldProc := byName(rs, old.Name)
	if err := oldProc.p.cmd.Process.Signal(syscall.SIGSTOP); err != nil {
		t.Fatal(err)
	}
	paused := time.Now()
	tg.down() // transitions are now due; only a leader may write them
	var next election.Leader
	deadline := time.Now().Add(20 * time.Second)
	for {
		if l, ok := leader(t, cli); ok && l.Name != old.Name {
			next = l
			break
		}
		if time.Now().After(deadline) {
			oldProc.p.cmd.Process.Signal(syscall.SIGCONT)
			t.Fatal("no new leader while the old one was paused")
		}
		time.Sleep(50 * time.Millisecond)
	}
	t.Logf("%s took over %s after %s was paused (session TTL 2s)", next.Name, time.Since(paused).Round(time.Millisecond), old.Name)
	h := awaitHealth(t, api, registryv1.HealthState_HEALTH_STATE_UNAVAILABLE, 20*time.Second)
	if h.Observer != next.Name || h.Fence != next.Rev {
		t.Fatalf("UNAVAILABLE written by %s under fence %d; the leader is %s with fence %d", h.Observer, h.Fence, next.Name, next.Rev)
	}
	// Resume the old leader with the target still down: its machine says
	// HEALTHY and one failed probe (failures_to_degraded is 1 for this
	// instance) is a transition it will try to write.
	if err := oldProc.p.cmd.Process.Signal(syscall.SIGCONT); err != nil {
		t.Fatal(err)
	}
	time.Sleep(500 * time.Millisecond)
	tg.up(t)
	awaitHealth(t, api, registryv1.HealthState_HEALTH_STATE_DEGRADED, 20*time.Second)
	time.Sleep(1500 * time.Millisecond) // time for the old leader to try
	before := probes(t, oldProc)
	time.Sleep(time.Second)
	if after := probes(t, oldProc); after != before {
		t.Fatalf("the deposed leader %s still probes: %d probes in 1s", old.Name, after-before)
	}

	// The takeover is the revision at which the old leader's key went
	// away (its lease expired), from etcd's history of the election.
	keys := record.NewKeys("")
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	var takeover int64
	for resp := range cli.Watch(ctx, keys.Election()+"/", clientv3.WithPrefix(), clientv3.WithRev(1), clientv3.WithPrevKV()) {
		for _, ev := range resp.Events {
			if ev.Type == clientv3.EventTypeDelete && ev.PrevKv != nil && ev.PrevKv.CreateRevision == old.Rev {
				takeover = ev.Kv.ModRevision
			}
		}
		if takeover != 0 {
			break
		}
	}
	if takeover == 0 {
		t.Fatal("the old leader's key was never deleted")
	}
	// etcd's history of the instance: every health write after the
	// takeover carries the new leader's name and fence; none is the old
	// leader's.
	key := keys.Instance("orders", "o-1")
	head, err := cli.Get(context.Background(), key)
	if err != nil || len(head.Kvs) == 0 {
		t.Fatal(err)
	}
	var writes, afterTakeover int
	var prev *registryv1.Health
	for resp := range cli.Watch(ctx, key, clientv3.WithRev(1)) {
		for _, ev := range resp.Events {
			in, err := keys.Decode(key, ev.Kv.Value, 0, 0)
			if err != nil {
				t.Fatal(err)
			}
			if h := in.Health; h != nil && (prev == nil || h.State != prev.State || h.Fence != prev.Fence) {
				writes++
				if ev.Kv.ModRevision > takeover {
					afterTakeover++
					if h.Observer != next.Name || h.Fence != next.Rev {
						t.Fatalf("revision %d: health %v written by %s (fence %d) after %s took over at %d with fence %d",
							ev.Kv.ModRevision, h.State, h.Observer, h.Fence, next.Name, takeover, next.Rev)
					}
				} else if h.Observer != old.Name || h.Fence != old.Rev {
					t.Fatalf("revision %d: health by %s (fence %d) while %s led", ev.Kv.ModRevision, h.Observer, h.Fence, old.Name)
				}
				prev = h
			}
			if ev.Kv.ModRevision >= head.Kvs[0].ModRevision {
				t.Logf("history: %d health writes, %d after the takeover, all by the leader of their time; the old leader had %d writes refused by the fence",
					writes, afterTakeover, metric(t, oldProc, "registry_fence_rejections_total"))
				if afterTakeover < 3 {
					t.Fatalf("only %d writes after the takeover; want DEGRADED, UNAVAILABLE and back to DEGRADED", afterTakeover)
				}
				return
			}
		}
	}
	t.Fatal("etcd history ended early")
}

// Killing the leader (SIGKILL) hands probing over within the session TTL
// plus a probe interval; a graceful stop (SIGTERM) hands it over at once.
func TestProberFailover(t *testing.T) {
	m := etcdtest.Start(t, false)
	cli := m.Client(t)
	rs := cluster(t, m.ClientURL, 3)
	tg := newTarget(t)
	c, err := client.New(client.Config{Endpoints: []string{rs[0].api, rs[1].api, rs[2].api}})
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	if _, err := c.API().Register(context.Background(), &registryv1.RegisterRequest{Instance: &registryv1.Instance{
		Service: "orders", Id: "o-1", Address: tg.addr, Check: &registryv1.HealthCheck{Kind: registryv1.CheckKind_CHECK_KIND_TCP}},
		Ttl: durationpbS(60)}); err != nil {
		t.Fatal(err)
	}
	awaitHealth(t, c.API(), registryv1.HealthState_HEALTH_STATE_HEALTHY, 20*time.Second)

	handover := func(sig syscall.Signal) time.Duration {
		t.Helper()
		old, ok := leader(t, cli)
		if !ok {
			t.Fatal("no leader")
		}
		p := byName(rs, old.Name)
		start := time.Now()
		if err := p.p.cmd.Process.Signal(sig); err != nil {
			t.Fatal(err)
		}
		for time.Since(start) < 20*time.Second {
			if l, ok := leader(t, cli); ok && l.Name != old.Name {
				// Probing, not just leading: the new leader's probe count moves.
				np := byName(rs, l.Name)
				n0 := probes(t, np)
				for time.Since(start) < 20*time.Second {
					if probes(t, np) > n0 {
						return time.Since(start)
					}
					time.Sleep(20 * time.Millisecond)
				}
			}
			time.Sleep(20 * time.Millisecond)
		}
		t.Fatalf("no other regnode probing 20s after %v to %s", sig, old.Name)
		return 0
	}
	graceful := handover(syscall.SIGTERM)
	killed := handover(syscall.SIGKILL)
	t.Logf("probing handed over %s after SIGTERM, %s after SIGKILL (session TTL 2s, probe interval 100ms)",
		graceful.Round(time.Millisecond), killed.Round(time.Millisecond))
	if graceful >= 2*time.Second {
		t.Fatalf("graceful stop took %s to hand over: it did not resign", graceful)
	}
	// TTL + interval is the design bound; the slack covers lease expiry
	// checks (etcd revokes expired leases on its own ticks) and the
	// observer's polling.
	if killed > 2*time.Second+100*time.Millisecond+2*time.Second {
		t.Fatalf("after SIGKILL, probing resumed only after %s", killed)
	}
}

func durationpbS(s int64) *durationpb.Duration { return &durationpb.Duration{Seconds: s} }
