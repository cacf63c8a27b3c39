// Package epoch names one etcd history. etcd keeps its cluster id across a
// snapshot restore made with the same member names, URLs and token, and
// revisions start again from the snapshot's, so neither tells one history
// from another: a revision alone cannot resume a subscription safely.
//
// The epoch is a random id stored at <prefix>epoch. It is created if absent
// (the first regnode of a registry, or a restore from a backup taken before
// it existed), and replaced, compare-and-swap from the value it had, by the
// first regnode that sees the restored etcd behind a revision it already
// delivered; every other regnode then finds a value other than its own and
// starts the new epoch too. A resume token is (epoch, revision).
package epoch

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"fmt"

	clientv3 "go.etcd.io/etcd/client/v3"

	"github.com/regcluster/registry/record"
)

// Key is where the epoch of the registry under prefix is kept.
func Key(prefix string) string { return record.NewKeys(prefix).Prefix() + "epoch" }

// New returns a fresh random epoch id.
func New() string {
	var b [12]byte
	_, _ = rand.Read(b[:]) // crypto/rand.Read never fails
	return hex.EncodeToString(b[:])
}

// Read returns the epoch stored at key ("" if absent), with a linearizable
// read, and the revision it was read at.
func Read(ctx context.Context, cli *clientv3.Client, key string) (string, int64, error) {
	resp, err := cli.Get(ctx, key)
	if err != nil {
		return "", 0, fmt.Errorf("read epoch %s: %w", key, err)
	}
	if len(resp.Kvs) == 0 {
		return "", resp.Header.Revision, nil
	}
	return string(resp.Kvs[0].Value), resp.Header.Revision, nil
}

// Ensure returns the epoch at key, creating it if absent.
func Ensure(ctx context.Context, cli *clientv3.Client, key string) (string, error) {
	return Replace(ctx, cli, key, "")
}

// Replace starts a new epoch if the one at key is still old ("" for
// absent), and returns the epoch now there: the new one, or the one
// another regnode put first.
func Replace(ctx context.Context, cli *clientv3.Client, key, old string) (string, error) {
	cmp := clientv3.Compare(clientv3.Value(key), "=", old)
	if old == "" {
		cmp = clientv3.Compare(clientv3.CreateRevision(key), "=", 0)
	}
	next := New()
	resp, err := cli.Txn(ctx).If(cmp).Then(clientv3.OpPut(key, next)).Else(clientv3.OpGet(key)).Commit()
	if err != nil {
		return "", fmt.Errorf("replace epoch %s (was %q): %w", key, old, err)
	}
	if resp.Succeeded {
		return next, nil
	}
	kvs := resp.Responses[0].GetResponseRange().GetKvs()
	if len(kvs) == 0 {
		return "", fmt.Errorf("replace epoch %s (was %q): deleted while replacing", key, old)
	}
	return string(kvs[0].Value), nil
}
