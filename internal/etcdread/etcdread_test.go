package etcdread_test

import (
	"context"
	"errors"
	"fmt"
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
	rev, header, err := etcdread.Range(ctx, cli, keys.Service("orders"), 0, 3, func(kv *mvccpb.KeyValue) {
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
	if rev2, _, err := etcdread.Range(ctx, cli, keys.Service("orders"), at, 2, func(*mvccpb.KeyValue) { n++ }); err != nil || rev2 != at || n != 9 {
		t.Fatalf("read at %d: %d keys at %d, %v; want 9 at %d", at, n, rev2, err, at)
	}
	last := put(t, cli, keys, "o-10")
	if _, err := cli.Compact(ctx, last); err != nil {
		t.Fatal(err)
	}
	if _, _, err := etcdread.Range(ctx, cli, keys.Service("orders"), at, 2, func(*mvccpb.KeyValue) {}); !errors.Is(err, rpctypes.ErrCompacted) {
		t.Fatalf("read at compacted revision %d: %v, want rpctypes.ErrCompacted", at, err)
	}
}
