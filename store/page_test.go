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
