package etcdread_test

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"sync"
	"testing"

	"go.etcd.io/etcd/api/v3/mvccpb"
	"go.etcd.io/etcd/api/v3/v3rpc/rpctypes"
	clientv3 "go.etcd.io/etcd/client/v3"
	"go.uber.org/goleak"

	"github.com/regcluster/registry/internal/etcdread"
	"github.com/regcluster/registry/internal/etcdtest"
	registryv1 "github.com/regcluster/registry/proto/registry/v1"
	"github.com/regcluster/registry/record"
)

func TestMain(m *testing.M) { goleak.VerifyTestMain(m, etcdtest.LeakOptions()...) }

func put(t *testing.T, cli *clientv3.Client, keys record.Keys, id string) int64 {
	t.Helper()
	v, err := record.Encode(&registryv1.Instance{Service: "orders", Id: id, Address: "10.0.0.1:80", Weight: 100})
	if err != nil {
		t.Fatal(err)
	}
	resp, err := cli.Put(context.Background(), keys.Instance("orders", id), string(v))
	if err != nil {
		t.Fatal(err)
	}
	return resp.Header.Revision
}

// Every page is read at the first page's revision: writes made between
// pages, before and after the cursor, are not seen; junk is skipped,
// logged and reported once; the revision returned is the read's.
func TestRangeReadsEveryPageAtOneRevision(t *testing.T) {
	cli := etcdtest.Start(t, false).Client(t)
	ctx := context.Background()
	keys := record.NewKeys("")
	for i := range 7 {
		put(t, cli, keys, fmt.Sprintf("o-%d", i))
	}
	if _, err := cli.Put(ctx, keys.Instance("orders", "o-3x"), "junk"); err != nil {
		t.Fatal(err)
	}
	at := put(t, cli, keys, "o-9")
	var junk []string
	dec := etcdread.Decoder{Keys: keys, OnJunk: func(key string, _ error) { junk = append(junk, key) }}
	var ids []string
	rev, header, err := etcdread.Range(ctx, cli, keys.Service("orders"), 0, 3, 1, func(kv *mvccpb.KeyValue) {
		if len(ids)+len(junk) == 0 {
			// After the first page is read: a delete behind the cursor, a
			// new key and an update ahead of it.
			if _, err := cli.Delete(ctx, keys.Instance("orders", "o-0")); err != nil {
				t.Error(err)
			}
			put(t, cli, keys, "o-5a")
			put(t, cli, keys, "o-8")
		}
		in, err := dec.Decode(kv)
		if err != nil {
			if !errors.Is(err, record.ErrJunk) {
				t.Errorf("junk %s: %v, want record.ErrJunk", kv.Key, err)
			}
			return
		}
		if kv.ModRevision > at {
			t.Errorf("%s at revision %d, after the read's %d", kv.Key, kv.ModRevision, at)
		}
		ids = append(ids, in.Id)
	})
	if err != nil {
		t.Fatal(err)
	}
	if rev != at || header.Revision <= 0 {
		t.Fatalf("read at %d (header %d), want %d", rev, header.Revision, at)
	}
	want := []string{"o-0", "o-1", "o-2", "o-3", "o-4", "o-5", "o-6", "o-9"}
	if fmt.Sprint(ids) != fmt.Sprint(want) {
		t.Fatalf("read %v, want %v", ids, want)
	}
	if len(junk) != 1 || junk[0] != keys.Instance("orders", "o-3x") {
		t.Fatalf("junk reported %v, want the one junk key once", junk)
	}
	// At a given revision, and at a compacted one.
	n := 0
	if rev2, _, err := etcdread.Range(ctx, cli, keys.Service("orders"), at, 2, 1, func(*mvccpb.KeyValue) { n++ }); err != nil || rev2 != at || n != 9 {
		t.Fatalf("read at %d: %d keys at %d, %v; want 9 at %d", at, n, rev2, err, at)
	}
	last := put(t, cli, keys, "o-10")
	if _, err := cli.Compact(ctx, last); err != nil {
		t.Fatal(err)
	}
	if _, _, err := etcdread.Range(ctx, cli, keys.Service("orders"), at, 2, 1, func(*mvccpb.KeyValue) {}); !errors.Is(err, rpctypes.ErrCompacted) {
		t.Fatalf("read at compacted revision %d: %v, want rpctypes.ErrCompacted", at, err)
	}
}

// pageKV records the size of every page etcd answers.
type pageKV struct {
	clientv3.KV
	mu    sync.Mutex
	pages []int
}

func (k *pageKV) Get(ctx context.Context, key string, opts ...clientv3.OpOption) (*clientv3.GetResponse, error) {
	resp, err := k.KV.Get(ctx, key, opts...)
	if err == nil {
		k.mu.Lock()
		k.pages = append(k.pages, len(resp.Kvs))
		k.mu.Unlock()
	}
	return resp, err
}

// Pages grow to about PageBytes at the size of the largest record seen,
// from the page size asked for up to MaxGrowth times it: small records
// come in few large pages, large ones in pages of the size asked for; a
// large record among small ones shrinks the next page; every key is read
// once, in order.
func TestRangePagesBySize(t *testing.T) {
	cli := etcdtest.Start(t, false).Client(t)
	ctx := context.Background()
	write := func(prefix string, n, size int) {
		t.Helper()
		per := max(1, min(100, (1<<20)/size)) // a Txn stays below etcd's request limit
		for from := 0; from < n; from += per {
			var ops []clientv3.Op
			for i := from; i < min(n, from+per); i++ {
				ops = append(ops, clientv3.OpPut(fmt.Sprintf("%s%05d", prefix, i), strings.Repeat("v", size)))
			}
			if _, err := cli.Txn(ctx).Then(ops...).Commit(); err != nil {
				t.Fatal(err)
			}
		}
	}
	read := func(prefix string) ([]int, int) {
		t.Helper()
		kv := &pageKV{KV: cli}
		var last string
		n := 0
		if _, _, err := etcdread.Range(ctx, kv, prefix, 0, 10, 0, func(kv *mvccpb.KeyValue) {
			if string(kv.Key) <= last {
				t.Fatalf("%s after %s", kv.Key, last)
			}
			last = string(kv.Key)
			n++
		}); err != nil {
			t.Fatal(err)
		}
		return kv.pages, n
	}
	// Records of 12 + 10,000 bytes: PageBytes holds 209, above MaxGrowth
	// times the 10 asked for.
	write("/small/", 1000, 10_000)
	pages, n := read("/small/")
	if n != 1000 || fmt.Sprint(pages) != "[10 100 100 100 100 100 100 100 100 100 90]" {
		t.Fatalf("small records: %d keys in pages %v, want 1000 in 10 then pages of %d", n, pages, etcdread.MaxGrowth*10)
	}
	// Records of 512 KiB: PageBytes holds 4, below the page size asked.
	write("/large/", 25, 512<<10)
	if pages, n := read("/large/"); n != 25 || fmt.Sprint(pages) != "[10 10 5]" {
		t.Fatalf("large records: %d keys in pages %v, want 25 in pages of 10", n, pages)
	}
	// One record of 1 MiB among small ones, in the first page: the page
	// after it stays at the size asked, the one after that grows.
	write("/mixed/a", 5, 100)
	write("/mixed/b", 1, 1<<20)
	write("/mixed/c", 55, 100)
	if pages, n := read("/mixed/"); n != 61 || fmt.Sprint(pages) != "[10 10 41]" {
		t.Fatalf("mixed records: %d keys in pages %v, want 61 in [10 10 41]", n, pages)
	}
}
