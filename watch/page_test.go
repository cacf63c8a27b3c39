package watch_test

import (
	"context"
	"errors"
	"fmt"
	"sync/atomic"
	"testing"
	"time"

	clientv3 "go.etcd.io/etcd/client/v3"

	"github.com/regcluster/registry/cache"
	"github.com/regcluster/registry/internal/etcdtest"
	registryv1 "github.com/regcluster/registry/proto/registry/v1"
	"github.com/regcluster/registry/record"
	"github.com/regcluster/registry/watch"
)

// bumpAll rewrites the n records of orders in one transaction with version
// v: at any one revision they all carry the same version.
func bumpAll(cli *clientv3.Client, n int, v int) (int64, error) {
	ops := make([]clientv3.Op, 0, n)
	for i := range n {
		b, err := record.Encode(&registryv1.Instance{Service: "orders", Id: fmt.Sprintf("o-%02d", i), Address: "10.0.0.1:80", Version: fmt.Sprint(v)})
		if err != nil {
			return 0, err
		}
		ops = append(ops, clientv3.OpPut(keys.Instance("orders", fmt.Sprintf("o-%02d", i)), string(b)))
	}
	resp, err := cli.Txn(context.Background()).Then(ops...).Commit()
	if err != nil {
		return 0, fmt.Errorf("bump to version %d: %w", v, err)
	}
	return resp.Header.Revision, nil
}

// A write landing between two pages of the watcher's list is not in the
// snapshot (every page is read at the first page's revision); it arrives
// after it, as one batch. The write is made from the junk callback, which
// the list calls while it decodes the first page: the list reads at most
// three pages ahead of its decoding, so most of the ten are read after
// the write.
func TestListPagesReadAtOneRevision(t *testing.T) {
	const n = 70 // ten pages of 7, and the junk
	cli := etcdtest.Start(t, false).Client(t)
	if _, err := bumpAll(cli, n, 0); err != nil {
		t.Fatal(err)
	}
	if _, err := cli.Put(context.Background(), keys.Instance("orders", "o-00x"), "junk"); err != nil {
		t.Fatal(err)
	}
	var bumped atomic.Int64
	w, err := watch.New(watch.Config{Client: cli, PageSize: 7, PageBytes: 1, OnJunk: func(string, error) {
		if bumped.Load() != 0 {
			return
		}
		rev, err := bumpAll(cli, n, 1)
		if err != nil {
			t.Error(err)
		}
		bumped.Store(rev)
	}})
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	var batches []cache.Batch
	errDone := errors.New("done")
	err = w.Run(ctx, func(b cache.Batch) error {
		batches = append(batches, b)
		if b.Revision >= bumped.Load() && bumped.Load() != 0 && len(b.Events) > 0 {
			return errDone
		}
		return nil
	})
	if !errors.Is(err, errDone) {
		t.Fatalf("Run: %v after %d batches", err, len(batches))
	}
	snap := batches[0]
	if !snap.Snapshot || len(snap.Instances) != n {
		t.Fatalf("first batch: snapshot %v with %d instances, want %d", snap.Snapshot, len(snap.Instances), n)
	}
	if snap.Revision >= bumped.Load() {
		t.Fatalf("snapshot at %d, the racing write at %d: it did not race", snap.Revision, bumped.Load())
	}
	for _, in := range snap.Instances {
		if in.Version != "0" || in.ModRevision > snap.Revision {
			t.Fatalf("snapshot at %d mixes revisions: %s has version %s (mod %d)", snap.Revision, in.Id, in.Version, in.ModRevision)
		}
	}
	last := batches[len(batches)-1]
	if last.Revision != bumped.Load() || len(last.Events) != n {
		t.Fatalf("the racing write arrived as %d events at %d, want %d at %d", len(last.Events), last.Revision, n, bumped.Load())
	}
}

// A list that fails between pages (etcd compacted past its revision while
// its decoder was a page behind) delivers nothing of it: the watcher
// lists again, and its first snapshot is whole, at one revision, from the
// second list.
func TestListFailingMidwayDeliversNothing(t *testing.T) {
	const n = 70 // ten pages of 7, and the junk
	cli := etcdtest.Start(t, false).Client(t)
	if _, err := bumpAll(cli, n, 0); err != nil {
		t.Fatal(err)
	}
	if _, err := cli.Put(context.Background(), keys.Instance("orders", "o-00x"), "junk"); err != nil {
		t.Fatal(err)
	}
	var compacted atomic.Int64
	var restarts atomic.Int64
	w, err := watch.New(watch.Config{Client: cli, PageSize: 7, PageBytes: 1, MinBackoff: time.Millisecond, MaxBackoff: 10 * time.Millisecond,
		OnRestart: func(string, error) { restarts.Add(1) },
		OnJunk: func(string, error) {
			if compacted.Load() != 0 {
				return
			}
			rev, err := bumpAll(cli, n, 1)
			if err == nil {
				_, err = cli.Compact(context.Background(), rev)
			}
			if err != nil {
				t.Error(err)
			}
			compacted.Store(rev)
		}})
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	var first cache.Batch
	errDone := errors.New("done")
	err = w.Run(ctx, func(b cache.Batch) error {
		first = b
		return errDone
	})
	if !errors.Is(err, errDone) {
		t.Fatalf("Run: %v", err)
	}
	if restarts.Load() == 0 || first.Revision < compacted.Load() {
		t.Fatalf("first snapshot at %d after %d restarts; etcd compacted to %d mid-list", first.Revision, restarts.Load(), compacted.Load())
	}
	if !first.Snapshot || len(first.Instances) != n || len(first.Encoded) != n {
		t.Fatalf("first batch: snapshot %v with %d instances, %d elements, want %d", first.Snapshot, len(first.Instances), len(first.Encoded), n)
	}
	for _, in := range first.Instances {
		if in.Version != "1" {
			t.Fatalf("snapshot at %d holds %s at version %s (mod %d): part of the failed list", first.Revision, in.Id, in.Version, in.ModRevision)
		}
	}
}
