// Package etcdread is how every reader of the registry reads instance
// records out of etcd: a prefix page by page with every page at one
// revision (Range), and every value decoded with junk (a value under the
// prefix that record.Keys.Decode refuses, say one written with etcdctl)
// skipped, logged and reported, never returned and never fatal (Decoder).
// The store's reads and the watch's lists both go through it, so the two
// cannot drift apart.
package etcdread

import (
	"context"
	"fmt"
	"log/slog"

	"go.etcd.io/etcd/api/v3/etcdserverpb"
	"go.etcd.io/etcd/api/v3/mvccpb"
	clientv3 "go.etcd.io/etcd/client/v3"

	registryv1 "github.com/regcluster/registry/proto/registry/v1"
	"github.com/regcluster/registry/record"
)

// Decoder decodes instance records and reports the junk among them.
type Decoder struct {
	// Keys is the key layout the records are under.
	Keys record.Keys
	// Log is warned of every junk record (nil: slog.Default()).
	Log *slog.Logger
	// OnJunk, if set, is called once for every junk record (to count it).
	OnJunk func(key string, err error)
}

// Decode returns the instance kv holds. A junk record is logged and
// reported, and returns the reason (wrapping record.ErrJunk).
func (d Decoder) Decode(kv *mvccpb.KeyValue) (*registryv1.Instance, error) {
	in, err := d.Keys.Decode(string(kv.Key), kv.Value, kv.CreateRevision, kv.ModRevision)
	if err != nil {
		d.Junk(string(kv.Key), err)
		return nil, err
	}
	return in, nil
}

// Junk logs and reports the record at key as junk, for err.
func (d Decoder) Junk(key string, err error) {
	log := d.Log
	if log == nil {
		log = slog.Default()
	}
	log.Warn("skipping junk record under the registry prefix", "key", key, "err", err)
	if d.OnJunk != nil {
		d.OnJunk(key, err)
	}
}

// Range reads every key under prefix at revision rev (0: the current
// one), at most pageSize keys a request (0: no limit), every request at
// the revision of the first, and calls each with every key-value in key
// order. It returns the revision the whole read is at and the first
// page's header (its cluster id; its Revision is etcd's at that moment).
// A revision compacted before or during the read fails with an error
// wrapping rpctypes.ErrCompacted: the caller lists again.
func Range(ctx context.Context, kv clientv3.KV, prefix string, rev, pageSize int64, each func(*mvccpb.KeyValue)) (int64, *etcdserverpb.ResponseHeader, error) {
	from, end := prefix, clientv3.GetPrefixRangeEnd(prefix)
	var header *etcdserverpb.ResponseHeader
	for {
		opts := []clientv3.OpOption{clientv3.WithRange(end), clientv3.WithLimit(pageSize)}
		if rev != 0 {
			opts = append(opts, clientv3.WithRev(rev))
		}
		resp, err := kv.Get(ctx, from, opts...)
		if err != nil {
			return 0, nil, fmt.Errorf("list %s at revision %d: %w", prefix, rev, err)
		}
		if header == nil {
			header = resp.Header
			if rev == 0 {
				rev = resp.Header.Revision
			}
		}
		for _, kv := range resp.Kvs {
			each(kv)
		}
		if !resp.More || len(resp.Kvs) == 0 {
			return rev, header, nil
		}
		from = string(resp.Kvs[len(resp.Kvs)-1].Key) + "\x00"
	}
}
