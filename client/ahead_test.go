package client_test

import (
	"context"
	"testing"
	"time"

	"github.com/regcluster/registry/client"
	"github.com/regcluster/registry/internal/etcdtest"
	"github.com/regcluster/registry/internal/node"
	"github.com/regcluster/registry/internal/regnodetest"
)

// A subscriber ahead of every regnode it can reach (they lag behind etcd,
// on its epoch) is answered REVISION_AHEAD by each after its catch-up wait;
// the SDK then subscribes afresh and takes the regnode's state as a new
// epoch of its view, instead of retrying forever.
func TestAheadOfEveryRegnodeResetsAfresh(t *testing.T) {
	m := etcdtest.Start(t, false)
	direct := m.Client(t)
	a := regnodetest.StartExternal(t, m.ClientURL)
	bLink := etcdtest.NewProxy(t, m.ClientURL)
	b := regnodetest.StartWith(t, node.Config{EtcdEndpoints: []string{bLink.URL()}}, m.ClientURL)
	toA := etcdtest.NewProxy(t, a.Addr)
	toB := etcdtest.NewProxy(t, b.Addr)
	toB.Cut()
	churn(t, direct, "orders", 20, 1)
	c := newClient(t, toA.Addr(), toB.Addr())
	rec := &recorder{}
	sub, err := c.Subscribe(context.Background(), "orders", client.SubscribeOptions{OnChange: rec.on})
	if err != nil {
		t.Fatal(err)
	}
	defer sub.Close()
	waitFor(t, 10*time.Second, "the first view", func() bool { return equalsEtcd(t, direct, sub, "orders") })

	bLink.Cut()        // B stops hearing from etcd for good
	defer bLink.Heal() // before the cleanups: B closes through etcd
	last := churn(t, direct, "orders", 30, 2)
	waitFor(t, 10*time.Second, "A's view", func() bool { return sub.Revision() >= last })
	bRev := b.Node.Hub().Revision()
	if bRev >= last {
		t.Fatal("B did not lag")
	}
	// Only B is left, behind the subscriber; it never catches up.
	toA.Cut()
	toB.Heal()
	waitFor(t, 30*time.Second, "a fresh view from B", func() bool { return sub.Revision() == bRev })
	if n := sub.Stats().Cache.NewEpochs; n != 1 {
		t.Fatalf("%d new epochs, want the one fresh subscription", n)
	}
	if sub.Epoch() != b.Node.Hub().Epoch() {
		t.Fatalf("view on epoch %q, B on %q", sub.Epoch(), b.Node.Hub().Epoch())
	}
	if got, want := len(sub.Instances("orders")), b.Node.Hub().Cache().Snapshot().Len(); got != want {
		t.Fatalf("view holds %d instances, B %d", got, want)
	}
}
