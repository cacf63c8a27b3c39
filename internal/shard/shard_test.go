package shard_test

import (
	"context"
	"fmt"
	"testing"
	"time"

	clientv3 "go.etcd.io/etcd/client/v3"
	"go.uber.org/goleak"

	"github.com/regcluster/registry/internal/etcdtest"
	"github.com/regcluster/registry/internal/shard"
)

func TestMain(m *testing.M) { goleak.VerifyTestMain(m, etcdtest.LeakOptions()...) }

func members(keys ...string) []shard.Member {
	var out []shard.Member
	for i, k := range keys {
		out = append(out, shard.Member{Key: k, Name: k, Lease: int64(i + 1)})
	}
	return out
}

// Each of n regnodes owns about 1/n of the instances; a regnode added
// takes instances only for itself (none moves between the others), about
// 1/(n+1) of them; a regnode lost hands over only its own.
func TestRendezvousSpreadsAndMovesLittle(t *testing.T) {
	const n = 30000
	three := &shard.View{Members: members("10.0.0.1:7400", "10.0.0.2:7400", "10.0.0.3:7400"), Self: 0}
	four := &shard.View{Members: members("10.0.0.1:7400", "10.0.0.2:7400", "10.0.0.3:7400", "10.0.0.4:7400"), Self: 0}
	two := &shard.View{Members: members("10.0.0.1:7400", "10.0.0.2:7400"), Self: 0}
	owned := map[string]int{}
	moved, movedWithin, lostMoved := 0, 0, 0
	for i := range n {
		svc, id := fmt.Sprintf("svc-%d", i%50), fmt.Sprintf("i-%d", i)
		o3, _ := three.Owner(svc, id)
		o4, _ := four.Owner(svc, id)
		o2, _ := two.Owner(svc, id)
		owned[o3.Key]++
		if o3.Key != o4.Key {
			moved++
			if o4.Key != "10.0.0.4:7400" {
				movedWithin++
			}
		}
		if o3.Key != "10.0.0.3:7400" && o2.Key != o3.Key {
			lostMoved++
		}
	}
	for k, c := range owned {
		if c < n/3-n/30 || c > n/3+n/30 {
			t.Errorf("%s owns %d of %d, want about a third", k, c, n)
		}
	}
	if movedWithin != 0 || lostMoved != 0 {
		t.Fatalf("%d instances moved between the old regnodes when one joined, %d moved that the lost one did not own", movedWithin, lostMoved)
	}
	if moved < n/4-n/30 || moved > n/4+n/30 {
		t.Fatalf("%d of %d moved to the new regnode, want about a quarter", moved, n)
	}
	if !three.Owns("svc-1", "i-1") && !(&shard.View{Members: three.Members, Self: 1}).Owns("svc-1", "i-1") &&
		!(&shard.View{Members: three.Members, Self: 2}).Owns("svc-1", "i-1") {
		t.Fatal("nobody owns svc-1/i-1")
	}
	if (&shard.View{Members: three.Members, Self: -1}).Owns("svc-1", "i-1") {
		t.Fatal("a regnode that is not a member owns an instance")
	}
}

// A confirmation goes to another zone's regnode first, and never to the
// asker.
func TestConfirmersPreferAnotherZone(t *testing.T) {
	ms := []shard.Member{{Key: "a:1", Zone: "z1", Lease: 1}, {Key: "b:1", Zone: "z1", Lease: 2}, {Key: "c:1", Zone: "z2", Lease: 3}}
	v := &shard.View{Members: ms, Self: 0}
	for i := range 100 {
		got := v.Confirmers("orders", fmt.Sprint(i), "z1")
		if len(got) != 2 || got[0].Key != "c:1" || got[1].Key != "b:1" {
			t.Fatalf("confirmers of orders/%d: %+v, want c:1 (another zone) then b:1", i, got)
		}
	}
}

func TestAnnouncementEncoding(t *testing.T) {
	for _, a := range []shard.Announcement{{Name: "r1"}, {Name: "r1", Zone: "eu-1"}, {Name: "{odd"}} {
		if got := shard.Decode([]byte(a.Encode())); got != a {
			t.Errorf("Decode(Encode(%+v)) = %+v", a, got)
		}
	}
	if got := shard.Decode([]byte("r1")); got.Name != "r1" || got.Zone != "" {
		t.Errorf("a bare name decodes as %+v", got)
	}
}

// The guard lands a write only while the view holds: a regnode joining
// (or re-announcing) refuses it until a new view is taken; one whose own
// session is gone can never write; a key without a lease is nobody.
func TestGuardFencesTheMembership(t *testing.T) {
	m := etcdtest.Start(t, false)
	cli := m.Client(t)
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	const prefix = "/t/nodes/"
	announce := func(addr string) clientv3.LeaseID {
		t.Helper()
		l, err := cli.Grant(ctx, 30)
		if err != nil {
			t.Fatal(err)
		}
		if _, err := cli.Put(ctx, prefix+addr, shard.Announcement{Name: addr}.Encode(), clientv3.WithLease(l.ID)); err != nil {
			t.Fatal(err)
		}
		return l.ID
	}
	self := announce("10.0.0.1:7400")
	announce("10.0.0.2:7400")
	if _, err := cli.Put(ctx, prefix+"10.0.0.9:7400", "ghost"); err != nil { // no lease
		t.Fatal(err)
	}
	w := shard.NewWatcher(cli, prefix, "10.0.0.1:7400", nil)
	wctx, stop := context.WithCancel(ctx)
	done := make(chan error, 1)
	go func() { done <- w.Run(wctx) }()
	defer func() { stop(); <-done }()
	view := func(ok func(*shard.View) bool) *shard.View {
		t.Helper()
		for {
			v, changed := w.View()
			if v != nil && ok(v) {
				return v
			}
			select {
			case <-changed:
			case <-ctx.Done():
				t.Fatalf("no view as wanted; last %+v", v)
			}
		}
	}
	write := func(v *shard.View) bool {
		t.Helper()
		resp, err := cli.Txn(ctx).If(v.Guard()...).Then(clientv3.OpPut("/t/instances/orders/o-1", "x")).Commit()
		if err != nil {
			t.Fatal(err)
		}
		return resp.Succeeded
	}
	v1 := view(func(v *shard.View) bool { return len(v.Members) == 2 })
	if v1.Self < 0 || v1.Members[v1.Self].Lease != int64(self) {
		t.Fatalf("view %+v: self not found with its lease", v1)
	}
	if !write(v1) {
		t.Fatal("a write under the current view was refused")
	}
	announce("10.0.0.3:7400")
	if write(v1) {
		t.Fatal("a write under a view older than a regnode's joining landed")
	}
	v2 := view(func(v *shard.View) bool { return len(v.Members) == 3 })
	if !write(v2) {
		t.Fatal("a write under the new view was refused")
	}
	if _, err := cli.Revoke(ctx, self); err != nil {
		t.Fatal(err)
	}
	if write(v2) {
		t.Fatal("a write of a regnode whose session is gone landed")
	}
	v3 := view(func(v *shard.View) bool { return len(v.Members) == 2 })
	if v3.Self != -1 || v3.Guard() != nil || v3.Owns("orders", "o-1") {
		t.Fatalf("a regnode no longer announced: view %+v owns or guards", v3)
	}
}
