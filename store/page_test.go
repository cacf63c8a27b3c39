package store_test

import (
	"context"
	"fmt"
	"sync"
	"sync/atomic"
	"testing"

	clientv3 "go.etcd.io/etcd/client/v3"

	"github.com/regcluster/registry/internal/etcdtest"
	registryv1 "github.com/regcluster/registry/proto/registry/v1"
	"github.com/regcluster/registry/record"
	"github.com/regcluster/registry/store"
)

const pageRecords = 12 // four pages of 3

// bumpAll rewrites every record of orders in one transaction with version
// n: at any one revision all records carry the same version, so a list
// that mixes revisions shows two.
func bumpAll(cli *clientv3.Client, keys record.Keys, n int) (int64, error) {
	ops := make([]clientv3.Op, 0, pageRecords)
	for i := range pageRecords {
		in := &registryv1.Instance{Service: "orders", Id: fmt.Sprintf("o-%02d", i), Address: "10.0.0.1:80", Version: fmt.Sprint(n)}
		b, err := record.Encode(in)
		if err != nil {
			return 0, err
		}
		ops = append(ops, clientv3.OpPut(keys.Instance("orders", in.Id), string(b)))
	}
	resp, err := cli.Txn(context.Background()).Then(ops...).Commit()
	if err != nil {
		return 0, fmt.Errorf("bump to %d: %w", n, err)
	}
	return resp.Header.Revision, nil
}

// oneRevision fails unless insts is every record, all of one version and
// none modified after rev.
func oneRevision(t *testing.T, insts []*registryv1.Instance, rev int64) {
	t.Helper()
	if len(insts) != pageRecords {
		t.Fatalf("list returned %d instances, want %d", len(insts), pageRecords)
	}
	for _, in := range insts {
		if in.Version != insts[0].Version || in.ModRevision > rev {
			t.Fatalf("list at revision %d mixes revisions: %s has version %s (mod %d), %s has version %s",
				rev, in.Id, in.Version, in.ModRevision, insts[0].Id, insts[0].Version)
		}
	}
}

// A write that lands between two pages of a List is not seen by the later
// pages: every page is read at the first page's revision. The write is
// made from the junk callback, which List calls while it decodes the first
// page, so it lands between pages every time.
func TestListPagesReadAtOneRevision(t *testing.T) {
	cli := etcdtest.Start(t, false).Client(t)
	keys := record.NewKeys("")
	if _, err := bumpAll(cli, keys, 0); err != nil {
		t.Fatal(err)
	}
	// Sorts between o-00 and o-01: in the first page.
	if _, err := cli.Put(context.Background(), keys.Instance("orders", "o-00x"), "junk"); err != nil {
		t.Fatal(err)
	}
	var bumped atomic.Int64
	s, err := store.New(store.Config{Client: cli, PageSize: 3, OnJunk: func(string, error) {
		rev, err := bumpAll(cli, keys, 1)
		if err != nil {
			t.Error(err)
		}
		bumped.CompareAndSwap(0, rev)
	}})
	if err != nil {
		t.Fatal(err)
	}
	insts, rev, skipped, err := s.List(context.Background(), "orders")
	if err != nil || skipped != 1 {
		t.Fatalf("list: skipped %d, %v", skipped, err)
	}
	if bumped.Load() == 0 || bumped.Load() <= rev {
		t.Fatalf("the racing write (revision %d) did not land after the list's revision %d", bumped.Load(), rev)
	}
	oneRevision(t, insts, rev)
	if insts[0].Version != "0" {
		t.Fatalf("list at %d shows version %s, want the one before the racing write", rev, insts[0].Version)
	}
}

// Lists racing a writer that rewrites every record in each transaction:
// each list is of one revision.
func TestListRacingWriter(t *testing.T) {
	cli := etcdtest.Start(t, false).Client(t)
	keys := record.NewKeys("")
	if _, err := bumpAll(cli, keys, 0); err != nil {
		t.Fatal(err)
	}
	s, err := store.New(store.Config{Client: cli, PageSize: 3})
	if err != nil {
		t.Fatal(err)
	}
	stop := make(chan struct{})
	var wg sync.WaitGroup
	var writes atomic.Int64
	wg.Add(1)
	go func() {
		defer wg.Done()
		for n := 1; ; n++ {
			select {
			case <-stop:
				return
			default:
			}
			if _, err := bumpAll(cli, keys, n); err != nil {
				t.Error(err)
				return
			}
			writes.Add(1)
		}
	}()
	var raced int
	for range 40 {
		w0 := writes.Load()
		insts, rev, _, err := s.List(context.Background(), "orders")
		if err != nil {
			t.Fatal(err)
		}
		oneRevision(t, insts, rev)
		if writes.Load() > w0 {
			raced++
		}
	}
	close(stop)
	wg.Wait()
	if raced == 0 {
		t.Fatal("no list overlapped a write: the test proved nothing")
	}
	t.Logf("%d of 40 lists overlapped a write", raced)
}

// ListPage's later pages are read at the revision of the first, whatever
// lands between the calls: a rewrite of every record, a delete and a new
// record after the last key are all unseen, so the pages together are the
// records as they were at the first page's revision.
func TestListPageCursorPinsRevision(t *testing.T) {
	cli := etcdtest.Start(t, false).Client(t)
	keys := record.NewKeys("")
	if _, err := bumpAll(cli, keys, 0); err != nil {
		t.Fatal(err)
	}
	s, err := store.New(store.Config{Client: cli})
	if err != nil {
		t.Fatal(err)
	}
	ctx := context.Background()
	first, err := s.ListPage(ctx, "orders", store.Cursor{}, 3, 1<<20)
	if err != nil {
		t.Fatal(err)
	}
	if first.Next == nil || len(first.Instances) != 3 {
		t.Fatalf("first page: %d instances, next %v; want 3 and a next page", len(first.Instances), first.Next)
	}
	// Between the pages: every record rewritten, the last deleted, and a
	// new one that sorts after every other.
	if _, err := bumpAll(cli, keys, 1); err != nil {
		t.Fatal(err)
	}
	if r, err := cli.Delete(ctx, keys.Instance("orders", fmt.Sprintf("o-%02d", pageRecords-1))); err != nil || r.Deleted != 1 {
		t.Fatalf("delete the last record: %v", err)
	}
	b, err := record.Encode(&registryv1.Instance{Service: "orders", Id: "o-99", Address: "10.0.0.1:80", Version: "1"})
	if err != nil {
		t.Fatal(err)
	}
	if _, err := cli.Put(ctx, keys.Instance("orders", "o-99"), string(b)); err != nil {
		t.Fatal(err)
	}
	insts := first.Instances
	pages := 1
	for cur := first.Next; cur != nil; pages++ {
		p, err := s.ListPage(ctx, "orders", *cur, 3, 1<<20)
		if err != nil {
			t.Fatalf("page %d: %v", pages+1, err)
		}
		if p.Revision != first.Revision {
			t.Fatalf("page %d says revision %d, the first page %d", pages+1, p.Revision, first.Revision)
		}
		insts = append(insts, p.Instances...)
		cur = p.Next
	}
	oneRevision(t, insts, first.Revision)
	if insts[0].Version != "0" {
		t.Fatalf("pages at %d show version %s, want the one before the writes between pages", first.Revision, insts[0].Version)
	}
	if pages != pageRecords/3 {
		t.Fatalf("%d pages of 3, want %d", pages, pageRecords/3)
	}
}
