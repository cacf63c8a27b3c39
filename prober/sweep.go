package prober

import (
	"context"
	"fmt"
	"time"

	clientv3 "go.etcd.io/etcd/client/v3"

	"github.com/regcluster/registry/election"
	"github.com/regcluster/registry/store"
)

// sweep deletes, through the fence, the saved states this leader has seen
// without a record for OrphanRetention, until ctx ends or the fence refuses
// a delete (this regnode no longer leads). What it has seen is kept in
// memory only: a new leader starts counting afresh, so a state is never
// deleted early, only late.
func (p *Prober) sweep(ctx context.Context, l *election.Leadership) {
	every := min(max(p.cfg.OrphanRetention/4, 10*time.Millisecond), time.Minute)
	tick := time.NewTicker(every)
	defer tick.Stop()
	seen := newOrphanClock(p.cfg.OrphanRetention)
	for {
		select {
		case <-ctx.Done():
			return
		case <-tick.C:
		}
		lctx, cancel := context.WithTimeout(ctx, 5*time.Second)
		list, _, err := p.cfg.Store.Orphans(lctx)
		cancel()
		if err != nil {
			if ctx.Err() == nil {
				p.log.Warn("list orphaned saved states", "err", err)
			}
			continue
		}
		for _, o := range seen.due(list, time.Now()) {
			dctx, cancel := context.WithTimeout(ctx, 5*time.Second)
			deleted, err := p.cfg.Store.DeleteOrphan(dctx, o, []clientv3.Cmp{l.Fence()})
			var held bool
			if err == nil && !deleted {
				// Changed, registered again, or the fence: which one?
				held, err = l.Held(dctx, p.cfg.Store.Client())
			}
			cancel()
			switch {
			case err != nil:
				// Still listed next time, so still due: tried again.
				if ctx.Err() == nil {
					p.log.Warn("delete orphaned saved state", "instance", o.Service+"/"+o.ID, "err", err)
				}
			case deleted:
				p.log.Info("deleted the saved state of an instance gone for good", "instance", o.Service+"/"+o.ID)
			case !held:
				p.log.Warn("orphaned saved state sweep refused by the fence: no longer the leader; sweeping stops", "fence", l.Rev)
				return
			}
		}
	}
}

// orphanClock tells when saved states without a record are due for
// deletion: once seen orphaned, unchanged, for the retention, across
// consecutive listings. It reads no clock (the time is an input).
type orphanClock struct {
	retention time.Duration
	since     map[store.Orphan]time.Time // keyed with the mod revision: a change restarts the count
}

func newOrphanClock(retention time.Duration) *orphanClock {
	return &orphanClock{retention: retention, since: map[store.Orphan]time.Time{}}
}

// due takes one listing of the orphans, made at now, and returns those
// orphaned for the whole retention. One missing from a listing (registered
// again, or deleted) is forgotten; one that comes back starts afresh. One
// due stays due until a listing no longer has it.
func (c *orphanClock) due(list []store.Orphan, now time.Time) []store.Orphan {
	next := make(map[store.Orphan]time.Time, len(list))
	var out []store.Orphan
	for _, o := range list {
		since, ok := c.since[o]
		if !ok {
			since = now
		}
		if now.Sub(since) >= c.retention {
			out = append(out, o)
		}
		next[o] = since
	}
	c.since = next
	return out
}

// Sweep is the election's part of a sharded prober: while this regnode
// leads, it deletes orphaned saved states (see sweep) until ctx ends, or
// returns election.ErrFenced once the fence refuses a delete.
func (p *Prober) Sweep(ctx context.Context, l *election.Leadership) error {
	if p.cfg.OrphanRetention <= 0 {
		<-ctx.Done()
		return ctx.Err()
	}
	p.sweep(ctx, l)
	if ctx.Err() != nil {
		return ctx.Err()
	}
	return fmt.Errorf("orphan sweep: %w", election.ErrFenced)
}
