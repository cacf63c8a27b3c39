package txnbatch_test

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"testing"
	"time"

	"go.etcd.io/etcd/api/v3/v3rpc/rpctypes"
	clientv3 "go.etcd.io/etcd/client/v3"
	"go.uber.org/goleak"

	"github.com/regcluster/registry/internal/etcdtest"
	"github.com/regcluster/registry/internal/txnbatch"
)

func TestMain(m *testing.M) { goleak.VerifyTestMain(m, etcdtest.LeakOptions()...) }

// run commits ops concurrently through b and returns each one's outcome.
func run(b *txnbatch.Batcher, ops []txnbatch.Op) ([]txnbatch.Result, []error) {
	res := make([]txnbatch.Result, len(ops))
	errs := make([]error, len(ops))
	var wg sync.WaitGroup
	for i, op := range ops {
		wg.Add(1)
		go func() {
			defer wg.Done()
			res[i], errs[i] = b.Do(context.Background(), op)
		}()
	}
	wg.Wait()
	return res, errs
}

func create(key, val string, lease clientv3.LeaseID) txnbatch.Op {
	return txnbatch.Op{If: []clientv3.Cmp{clientv3.Compare(clientv3.CreateRevision(key), "=", 0)},
		Then: []clientv3.Op{clientv3.OpPut(key, val, clientv3.WithLease(lease))},
		Else: []clientv3.Op{clientv3.OpGet(key)}}
}

// A member whose lease etcd does not have makes etcd refuse the whole Txn:
// the batch goes again member by member, and only that member fails.
func TestMemberFaultStaysItsOwn(t *testing.T) {
	cli := etcdtest.Start(t, false).Client(t)
	ctx := context.Background()
	const n = 6
	b, err := txnbatch.New(txnbatch.Config{Client: cli, MaxOps: n, InFlight: 1, Linger: time.Minute})
	if err != nil {
		t.Fatal(err)
	}
	defer b.Close()
	g, err := cli.Grant(ctx, 60)
	if err != nil {
		t.Fatal(err)
	}
	gone, err := cli.Grant(ctx, 60)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := cli.Revoke(ctx, gone.ID); err != nil {
		t.Fatal(err)
	}
	ops := make([]txnbatch.Op, n)
	for i := range n {
		lease := g.ID
		if i == 2 {
			lease = gone.ID
		}
		ops[i] = create(fmt.Sprint("k", i), "v", lease)
	}
	res, errs := run(b, ops)
	for i := range n {
		if i == 2 {
			if !errors.Is(errs[i], rpctypes.ErrLeaseNotFound) {
				t.Fatalf("the member under a revoked lease: %v, want lease not found", errs[i])
			}
			continue
		}
		if errs[i] != nil || !res[i].Succeeded {
			t.Fatalf("member %d: %+v, %v; failed with the faulty one", i, res[i], errs[i])
		}
	}
	if st := b.Stats(); st.Split != 1 || st.Txns != 1+n {
		t.Fatalf("stats %+v: want one batch, split into %d", st, n)
	}
	resp, err := cli.Get(ctx, "k", clientv3.WithPrefix(), clientv3.WithCountOnly())
	if err != nil || resp.Count != n-1 {
		t.Fatalf("%d keys (%v), want %d", resp.Count, err, n-1)
	}
}

// Members writing one key never share a Txn (etcd refuses a key put twice
// in one): each lands in its own batch, in turn, and each sees the other's
// write as a compare would.
func TestSameKeyNotInOneBatch(t *testing.T) {
	cli := etcdtest.Start(t, false).Client(t)
	// Were the two allowed in one batch, the linger would gather them.
	b, err := txnbatch.New(txnbatch.Config{Client: cli, InFlight: 1, MaxOps: 2, Linger: 500 * time.Millisecond})
	if err != nil {
		t.Fatal(err)
	}
	defer b.Close()
	res, errs := run(b, []txnbatch.Op{create("same", "a", clientv3.NoLease), create("same", "b", clientv3.NoLease)})
	for _, err := range errs {
		if err != nil {
			t.Fatal(err)
		}
	}
	if res[0].Succeeded == res[1].Succeeded {
		t.Fatalf("both creates of one key took the same branch: %+v", res)
	}
	if st := b.Stats(); st.Split != 0 {
		t.Fatalf("stats %+v: a batch was refused", st)
	}
}

// Closed, a Batcher refuses calls and its committers are gone (goleak).
func TestClosed(t *testing.T) {
	cli := etcdtest.Start(t, false).Client(t)
	b, err := txnbatch.New(txnbatch.Config{Client: cli})
	if err != nil {
		t.Fatal(err)
	}
	b.Close()
	b.Close()
	if _, err := b.Do(context.Background(), create("k", "v", clientv3.NoLease)); !errors.Is(err, txnbatch.ErrClosed) {
		t.Fatalf("Do after Close: %v", err)
	}
	if _, err := txnbatch.New(txnbatch.Config{Client: cli, MaxOps: 129}); err == nil {
		t.Fatal("MaxOps over etcd's default max-txn-ops accepted")
	}
}
