package prober_test

import (
	"context"
	"fmt"
	"net"
	"net/http"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	clientv3 "go.etcd.io/etcd/client/v3"

	"github.com/regcluster/registry/internal/etcdtest"
	"github.com/regcluster/registry/internal/node"
	"github.com/regcluster/registry/internal/regnodetest"
	"github.com/regcluster/registry/internal/shard"
	registryv1 "github.com/regcluster/registry/proto/registry/v1"
)

// pair is two regnodes, a and b, probing every 100ms on one etcd.
type pair struct {
	a, b *regnodetest.Regnode
	api  registryv1.RegistryClient
}

func newPair(t *testing.T, cfg node.Config) *pair {
	t.Helper()
	m := etcdtest.Start(t, false)
	start := func(name string) *regnodetest.Regnode {
		c := cfg
		c.EtcdEndpoints, c.Name, c.ProbeInterval, c.SessionTTL = []string{m.ClientURL}, name, 100*time.Millisecond, 2*time.Second
		return regnodetest.StartWith(t, c, m.ClientURL)
	}
	p := &pair{a: start("a"), b: start("b")}
	p.api = apiOf(t, p.a)
	return p
}

// probing is the Status of rn's prober.
func probing(t *testing.T, api registryv1.RegistryClient) *registryv1.Probing {
	t.Helper()
	resp, err := api.Status(context.Background(), &registryv1.StatusRequest{})
	if err != nil {
		t.Fatal(err)
	}
	return resp.Probing
}

// byAgent is an HTTP health endpoint that fails (503) the probes whose
// User-Agent names a regnode in failFor ("*": every probe).
type byAgent struct {
	addr    string
	failFor atomic.Value // string
}

func newByAgent(t *testing.T) *byAgent {
	t.Helper()
	b := &byAgent{}
	b.failFor.Store("")
	srv := &http.Server{Handler: http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		f := b.failFor.Load().(string)
		if f == "*" || (f != "" && strings.Contains(r.UserAgent(), "("+f+")")) {
			w.WriteHeader(http.StatusServiceUnavailable)
		}
	})}
	lis, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	b.addr = lis.Addr().String()
	go srv.Serve(lis)
	t.Cleanup(func() { srv.Close() })
	return b
}

func registerHTTP(t *testing.T, api registryv1.RegistryClient, id, addr string) {
	t.Helper()
	check := steady(registryv1.CheckKind_CHECK_KIND_HTTP, "/healthz")
	if _, err := api.Register(context.Background(), &registryv1.RegisterRequest{Instance: &registryv1.Instance{
		Service: "orders", Id: id, Address: addr, Check: check}}); err != nil {
		t.Fatal(err)
	}
}

// A partial partition: the backends fail only regnode a's probes. An
// instance a owns goes DEGRADED (a's own verdict) but never UNAVAILABLE:
// b's confirming probe passes, and a counts the disagreement, which its
// Status shows. When the backends really fail, b confirms and they are
// evicted.
func TestPartialPartitionNeverEvicts(t *testing.T) {
	p := newPair(t, node.Config{MassDemotionShare: -1})
	const n = 8
	backends := make([]*byAgent, n)
	recs := make([]*recorder, n)
	for i := range backends {
		backends[i] = newByAgent(t)
		id := fmt.Sprintf("h-%d", i)
		recs[i] = recordKey(t, p.a.Etcd, p.a.Prefix, id)
		registerHTTP(t, p.api, id, backends[i].addr)
	}
	owner := make([]string, n)
	for i, r := range recs {
		owner[i] = r.await(healthy, 30*time.Second).Observer
	}
	ownedByA := 0
	for _, o := range owner {
		if o == "a" {
			ownedByA++
		}
	}
	if ownedByA == 0 || ownedByA == n {
		t.Fatalf("owners %v: want both regnodes to own some of %d instances", owner, n)
	}
	for _, b := range backends {
		b.failFor.Store("a")
	}
	for i, r := range recs {
		if owner[i] == "a" {
			r.await(degraded, 30*time.Second)
		}
	}
	// Each of a's instances asks b at least twice, and b disagrees.
	apiA := apiOf(t, p.a)
	deadline := time.Now().Add(60 * time.Second)
	for probing(t, apiA).Disagreements < uint64(2*ownedByA) {
		if time.Now().After(deadline) {
			t.Fatalf("a counted %d disagreements, want at least %d", probing(t, apiA).Disagreements, 2*ownedByA)
		}
		time.Sleep(20 * time.Millisecond)
	}
	for i, r := range recs {
		for _, s := range r.states() {
			if s == unavailable {
				t.Fatalf("h-%d (owned by %s) was evicted while only a's probes failed: %v", i, owner[i], r.states())
			}
		}
	}
	resp, err := p.api.Status(context.Background(), &registryv1.StatusRequest{Peers: true})
	if err != nil {
		t.Fatal(err)
	}
	shown := map[string]*registryv1.Probing{}
	for _, rp := range resp.Regnodes {
		shown[rp.Node] = rp
	}
	if len(resp.Regnodes) != 2 || shown["a"].GetDisagreements() == 0 || shown["a"].GetOwned()+shown["b"].GetOwned() != n {
		t.Fatalf("Status with peers: %v", resp.Regnodes)
	}

	for _, b := range backends {
		b.failFor.Store("*")
	}
	for i, r := range recs {
		h := r.await(unavailable, 60*time.Second)
		if owner[i] == "a" && !strings.Contains(h.Reason, "confirmed by b") {
			t.Fatalf("h-%d evicted by a with reason %q, want confirmed by b", i, h.Reason)
		}
		r.checkHistory(healthy, degraded, unavailable)
	}
}

// A regnode whose canaries fail demotes nothing: here its only peer is
// announced (a live lease) at an address nobody listens on. Once the
// peer's announcement goes, a is alone and demotes as usual.
func TestFailingCanaryHoldsDemotions(t *testing.T) {
	m := etcdtest.Start(t, false)
	rn := regnodetest.StartWith(t, node.Config{EtcdEndpoints: []string{m.ClientURL}, Name: "a",
		ProbeInterval: 100 * time.Millisecond, SessionTTL: 2 * time.Second}, m.ClientURL)
	api := apiOf(t, rn)
	ctx := context.Background()
	dead, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	deadAddr := dead.Addr().String()
	dead.Close()
	lease, err := rn.Etcd.Grant(ctx, 60)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := rn.Etcd.Put(ctx, rn.Prefix+"nodes/"+deadAddr, "ghost", clientv3.WithLease(lease.ID)); err != nil {
		t.Fatal(err)
	}
	deadline := time.Now().Add(30 * time.Second)
	for probing(t, api).Canary == "" {
		if time.Now().After(deadline) {
			t.Fatal("a's canaries never failed with its only peer unreachable")
		}
		time.Sleep(20 * time.Millisecond)
	}
	// Register until one instance is a's (the ghost owns the others).
	var rec *recorder
	var backend *byAgent
	for i := 0; rec == nil; i++ {
		if i == 64 {
			t.Fatal("none of 64 instances is a's")
		}
		b := newByAgent(t)
		id := fmt.Sprintf("c-%d", i)
		r := recordKey(t, rn.Etcd, rn.Prefix, id)
		registerHTTP(t, api, id, b.addr)
		if ownerOf(t, rn, id) != deadAddr {
			rec, backend = r, b
		}
	}
	rec.await(healthy, 30*time.Second)
	backend.failFor.Store("*")
	deadline = time.Now().Add(30 * time.Second)
	for probing(t, api).Held < 5 {
		if time.Now().After(deadline) {
			t.Fatalf("held %d demotions while the canaries fail, want 5", probing(t, api).Held)
		}
		time.Sleep(20 * time.Millisecond)
	}
	if got := rec.states(); len(got) != 1 || got[0] != healthy {
		t.Fatalf("health written while the canaries fail: %v", got)
	}
	if _, err := rn.Etcd.Revoke(ctx, lease.ID); err != nil {
		t.Fatal(err)
	}
	rec.await(degraded, 30*time.Second)
	rec.await(unavailable, 30*time.Second)
}

// At most MassDemotionShare of one service's checked instances are
// evicted within the window, even when every one fails: the rest are held
// (counted), and stay as they were.
func TestMassEvictionLimited(t *testing.T) {
	m := etcdtest.Start(t, false)
	rn := regnodetest.StartWith(t, node.Config{EtcdEndpoints: []string{m.ClientURL}, Name: "a",
		ProbeInterval: 100 * time.Millisecond, SessionTTL: 2 * time.Second, MassDemotionWindow: time.Hour}, m.ClientURL)
	api := apiOf(t, rn)
	const n = 6
	backends := make([]*byAgent, n)
	recs := make([]*recorder, n)
	for i := range backends {
		backends[i] = newByAgent(t)
		id := fmt.Sprintf("m-%d", i)
		recs[i] = recordKey(t, rn.Etcd, rn.Prefix, id)
		registerHTTP(t, api, id, backends[i].addr)
	}
	for _, r := range recs {
		r.await(healthy, 30*time.Second)
	}
	for _, b := range backends {
		b.failFor.Store("*")
	}
	for _, r := range recs {
		r.await(degraded, 30*time.Second)
	}
	// Half (3 of 6) may go; the other three are held, each several times.
	deadline := time.Now().Add(60 * time.Second)
	for probing(t, api).Held < 3*5 {
		if time.Now().After(deadline) {
			t.Fatalf("held %d evictions, want at least 15", probing(t, api).Held)
		}
		time.Sleep(20 * time.Millisecond)
	}
	evicted := 0
	for _, r := range recs {
		for _, s := range r.states() {
			if s == unavailable {
				evicted++
			}
		}
	}
	if evicted != 3 {
		t.Fatalf("%d of %d instances evicted, want 3 (half of the service)", evicted, n)
	}
}

// ownerOf computes, from the announcements in etcd, which member address
// owns orders/id.
func ownerOf(t *testing.T, rn *regnodetest.Regnode, id string) string {
	t.Helper()
	resp, err := rn.Etcd.Get(context.Background(), rn.Prefix+"nodes/", clientv3.WithPrefix())
	if err != nil {
		t.Fatal(err)
	}
	v := shard.View{Self: -1}
	for _, kv := range resp.Kvs {
		if kv.Lease != 0 {
			v.Members = append(v.Members, shard.Member{Key: strings.TrimPrefix(string(kv.Key), rn.Prefix+"nodes/"), Lease: kv.Lease})
		}
	}
	o, _ := v.Owner("orders", id)
	return o.Key
}
