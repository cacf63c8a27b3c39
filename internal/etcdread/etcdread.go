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

// PageBytes is the default of how many bytes of records a later page of
// Range may grow to (Range's pageBytes); MaxGrowth bounds a page at that
// many times the first.
//
// Why pages grow: etcd counts the rest of the range on every page it
// serves (treeIndex.Revisions visits every key after the cursor to give
// the total), so N keys read in pages of P cost O(N²/P) on etcd's side:
// 100,000 keys in pages of 1,000 took about twice as long as in pages of
// 10,000 (regbench resync). Most records are far below their 16 KiB
// limit, so a page sized by bytes is larger than one sized for the
// largest record, and no larger in memory.
const (
	PageBytes = 2 << 20
	MaxGrowth = 10
)

// Range reads every key under prefix at revision rev (0: the current
// one), every request at the revision of the first, and calls each with
// every key-value in key order. The first request asks for pageSize keys
// (0: no limit); each later one for as many as pageBytes holds at the
// size of the largest record of the page before, at least pageSize and
// at most MaxGrowth × pageSize (pageBytes 0: PageBytes; below one
// record's size: every page is pageSize). It returns the revision the whole read
// is at and the first page's header (its cluster id; its Revision is
// etcd's at that moment). A revision compacted before or during the read
// fails with an error wrapping rpctypes.ErrCompacted: the caller lists
// again.
func Range(ctx context.Context, kv clientv3.KV, prefix string, rev, pageSize, pageBytes int64, each func(*mvccpb.KeyValue)) (int64, *etcdserverpb.ResponseHeader, error) {
	if pageBytes == 0 {
		pageBytes = PageBytes
	}
	from, end := prefix, clientv3.GetPrefixRangeEnd(prefix)
	var header *etcdserverpb.ResponseHeader
	limit := pageSize
	for {
		opts := []clientv3.OpOption{clientv3.WithRange(end), clientv3.WithLimit(limit)}
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
		limit = nextLimit(pageSize, pageBytes, resp.Kvs)
	}
}

// nextLimit is the key limit of the page after kvs (see Range).
func nextLimit(pageSize, pageBytes int64, kvs []*mvccpb.KeyValue) int64 {
	if pageSize <= 0 {
		return pageSize
	}
	largest := 1
	for _, kv := range kvs {
		largest = max(largest, len(kv.Key)+len(kv.Value))
	}
	return min(max(pageSize, pageBytes/int64(largest)), MaxGrowth*pageSize)
}
