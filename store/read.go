package store

import (
	"context"
	"errors"
	"fmt"
	"time"

	"go.etcd.io/etcd/api/v3/mvccpb"
	"go.etcd.io/etcd/api/v3/v3rpc/rpctypes"
	clientv3 "go.etcd.io/etcd/client/v3"

	"github.com/regcluster/registry/internal/etcdread"
	"github.com/regcluster/registry/internal/secret"
	registryv1 "github.com/regcluster/registry/proto/registry/v1"
	"github.com/regcluster/registry/record"
)

// read returns the record of service/id and its saved state (nil when
// absent), both read at one revision, which it returns.
func (s *Store) read(ctx context.Context, service, id string) (ikv, skv *mvccpb.KeyValue, rev int64, err error) {
	if err := record.ValidService(service); err != nil {
		return nil, nil, 0, err
	}
	if err := record.ValidID(id); err != nil {
		return nil, nil, 0, err
	}
	resp, err := s.cli.Txn(ctx).Then(clientv3.OpGet(s.keys.Instance(service, id)), clientv3.OpGet(s.StateKey(service, id))).Commit()
	if err != nil {
		return nil, nil, 0, err
	}
	if kvs := resp.Responses[0].GetResponseRange().Kvs; len(kvs) > 0 {
		ikv = kvs[0]
	}
	if kvs := resp.Responses[1].GetResponseRange().Kvs; len(kvs) > 0 {
		skv = kvs[0]
	}
	return ikv, skv, resp.Header.Revision, nil
}

// owner is the secret hash a saved state holds ("" if none or junk).
func (s *Store) owner(service, id string, skv *mvccpb.KeyValue) string {
	if skv == nil {
		return ""
	}
	st, err := decodeState(service, id, skv.Value)
	if err != nil {
		return ""
	}
	return st.Incarnation
}

func (s *Store) owns(sec, service, id string, skv *mvccpb.KeyValue) bool {
	return secret.Matches(sec, s.owner(service, id, skv))
}

// Get returns the record of service/id and the revision it was read at. A
// missing or junk record returns an error wrapping record.ErrNotFound (junk
// is also reported).
func (s *Store) Get(ctx context.Context, service, id string) (*registryv1.Instance, int64, error) {
	if err := record.ValidService(service); err != nil {
		return nil, 0, err
	}
	if err := record.ValidID(id); err != nil {
		return nil, 0, err
	}
	key := s.keys.Instance(service, id)
	resp, err := s.cli.Get(ctx, key)
	if err != nil {
		return nil, 0, fmt.Errorf("get %s: %w", key, err)
	}
	if len(resp.Kvs) == 0 {
		return nil, resp.Header.Revision, fmt.Errorf("%s/%s: %w", service, id, record.ErrNotFound)
	}
	kv := resp.Kvs[0]
	inst, err := s.keys.Decode(key, kv.Value, kv.CreateRevision, kv.ModRevision)
	if err != nil {
		s.junk(key, err)
		return nil, resp.Header.Revision, fmt.Errorf("%s/%s: %w (the stored record is junk)", service, id, record.ErrNotFound)
	}
	return inst, resp.Header.Revision, nil
}

// List returns every valid instance of service (every service if empty),
// sorted by key, all read at one revision, which it returns. It reads in
// pages; if etcd compacts that revision mid-way it starts over. skipped
// counts junk records left out.
func (s *Store) List(ctx context.Context, service string) (insts []*registryv1.Instance, rev int64, skipped int, err error) {
	prefix := s.keys.Instances()
	if service != "" {
		if err := record.ValidService(service); err != nil {
			return nil, 0, 0, err
		}
		prefix = s.keys.Service(service)
	}
	for {
		insts, rev, skipped, err = s.list(ctx, prefix)
		if errors.Is(err, rpctypes.ErrCompacted) {
			continue
		}
		return insts, rev, skipped, err
	}
}

func (s *Store) list(ctx context.Context, prefix string) ([]*registryv1.Instance, int64, int, error) {
	var (
		out     []*registryv1.Instance
		skipped int
	)
	dec := s.decoder()
	rev, _, err := etcdread.Range(ctx, s.cli, prefix, 0, s.page, 0, func(kv *mvccpb.KeyValue) {
		if inst, err := dec.Decode(kv); err != nil {
			skipped++
		} else {
			out = append(out, inst)
		}
	})
	if err != nil {
		return nil, 0, 0, err
	}
	return out, rev, skipped, nil
}

// CompactRevision returns the revision etcd has compacted up to (0 if it
// never compacted). etcd reports it only to a watcher that asks for a
// compacted revision, so this opens a watch from revision 1 on a key nobody
// writes, and asks for progress to learn "not compacted" without waiting.
func (s *Store) CompactRevision(ctx context.Context) (int64, error) {
	ctx, cancel := context.WithTimeout(clientv3.WithRequireLeader(ctx), 5*time.Second)
	defer cancel()
	probe := s.keys.Prefix() + "\x00compact-probe"
	wch := s.cli.Watch(ctx, probe, clientv3.WithRev(1), clientv3.WithFilterPut(), clientv3.WithFilterDelete(), clientv3.WithCreatedNotify())
	// etcd answers a progress request only once the watcher has caught up
	// with history, so ask again until it does.
	tick := time.NewTicker(100 * time.Millisecond)
	defer tick.Stop()
	for {
		select {
		case resp, ok := <-wch:
			if !ok {
				return 0, fmt.Errorf("read compact revision: %w", ctx.Err())
			}
			if resp.CompactRevision != 0 {
				return resp.CompactRevision, nil
			}
			if err := resp.Err(); err != nil {
				return 0, fmt.Errorf("read compact revision: %w", err)
			}
			if resp.IsProgressNotify() {
				return 0, nil
			}
		case <-tick.C:
			if err := s.cli.RequestProgress(ctx); err != nil {
				return 0, fmt.Errorf("read compact revision: %w", err)
			}
		}
	}
}
