package store

import (
	"context"
	"errors"
	"fmt"

	"go.etcd.io/etcd/api/v3/v3rpc/rpctypes"
	clientv3 "go.etcd.io/etcd/client/v3"
	"google.golang.org/protobuf/encoding/protowire"
	"google.golang.org/protobuf/proto"

	"github.com/regcluster/registry/internal/epoch"
	registryv1 "github.com/regcluster/registry/proto/registry/v1"
	"github.com/regcluster/registry/record"
)

// Cursor is where a listing stands: the revision and epoch of its first
// page and the last key read. The zero Cursor starts a listing.
type Cursor struct {
	Revision int64
	Epoch    string
	Key      string
}

// Page is one page of a listing.
type Page struct {
	Instances []*registryv1.Instance
	// Revision and Epoch are those of the first page, for every page.
	Revision int64
	Epoch    string
	// Skipped counts this page's junk records.
	Skipped int
	// Next is where the next page starts; nil on the last page.
	Next *Cursor
}

// ListPage reads the page of service ("" for every service) after cur: at
// most limit records, whose instances encode to at most maxBytes in all
// (at least one instance, whatever its size), all read at cur.Revision
// (the current revision for the first page, which the page returns with
// the epoch read with it). A later page fails with ErrPageExpired once the
// revision is compacted or etcd's epoch is no longer cur.Epoch.
func (s *Store) ListPage(ctx context.Context, service string, cur Cursor, limit int64, maxBytes int) (Page, error) {
	prefix := s.keys.Instances()
	if service != "" {
		if err := record.ValidService(service); err != nil {
			return Page{}, err
		}
		prefix = s.keys.Service(service)
	}
	end := clientv3.GetPrefixRangeEnd(prefix)
	from := prefix
	if cur.Key != "" {
		if cur.Key < prefix || cur.Key >= end {
			return Page{}, &record.FieldError{Field: "page_token", Reason: fmt.Sprintf("key %q is not under %q", cur.Key, prefix)}
		}
		from = cur.Key + "\x00"
	}
	opts := []clientv3.OpOption{clientv3.WithRange(end), clientv3.WithLimit(limit)}
	if cur.Revision != 0 {
		opts = append(opts, clientv3.WithRev(cur.Revision))
	}
	// One txn: the epoch is read at the same revision as the first page,
	// and, for a later page, as etcd has it now.
	ekey := epoch.Key(s.keys.Prefix())
	resp, err := s.cli.Txn(ctx).Then(clientv3.OpGet(ekey), clientv3.OpGet(from, opts...)).Commit()
	if errors.Is(err, rpctypes.ErrCompacted) {
		return Page{}, fmt.Errorf("%w: revision %d of %s was compacted", ErrPageExpired, cur.Revision, prefix)
	}
	if err != nil {
		return Page{}, fmt.Errorf("list %s after %q at revision %d: %w", prefix, cur.Key, cur.Revision, err)
	}
	ep := ""
	if kvs := resp.Responses[0].GetResponseRange().GetKvs(); len(kvs) > 0 {
		ep = string(kvs[0].Value)
	}
	p := Page{Revision: cur.Revision, Epoch: cur.Epoch}
	if cur.Revision == 0 {
		p.Revision, p.Epoch = resp.Header.Revision, ep
	} else if ep != cur.Epoch {
		return Page{}, fmt.Errorf("%w: etcd is on epoch %q, the listing was at %q", ErrPageExpired, ep, cur.Epoch)
	}
	rr := resp.Responses[1].GetResponseRange()
	used := 0
	for i, kv := range rr.Kvs {
		inst, err := s.decoder().Decode(kv)
		if err != nil {
			p.Skipped++
			continue
		}
		n := proto.Size(inst)
		c := 1 + protowire.SizeVarint(uint64(n)) + n
		if len(p.Instances) > 0 && used+c > maxBytes {
			p.Next = &Cursor{Revision: p.Revision, Epoch: p.Epoch, Key: string(rr.Kvs[i-1].Key)}
			return p, nil
		}
		used += c
		p.Instances = append(p.Instances, inst)
	}
	if rr.More && len(rr.Kvs) > 0 {
		p.Next = &Cursor{Revision: p.Revision, Epoch: p.Epoch, Key: string(rr.Kvs[len(rr.Kvs)-1].Key)}
	}
	return p, nil
}
