// Package watch follows the registry's instances in etcd the way
// Kubernetes' reflector follows a resource: list at one revision R (every
// page read at R), deliver that snapshot, watch from R+1, and deliver each
// etcd transaction as one batch, in revision order.
//
// It never stops on its own and never goes back in time. A broken stream is
// resumed from the last delivered revision + 1, with backoff and jitter. A
// compacted revision leads to a fresh list, delivered as a reset snapshot.
// If etcd's cluster id changes, or its revision is found lower than one
// already delivered (etcd restored from a backup), or (with
// Config.EpochKey) the epoch stored in etcd changes, a snapshot flagged
// NewEpoch is delivered and the change is logged at error level: that is
// the one case where the revision may go down. With Config.EpochKey, the
// Watcher is also the one that starts a new epoch when it finds a restored
// etcd still carrying the old one (see internal/epoch). Idle watchers ask etcd for
// progress so their revision keeps moving; watches require a leader, so a
// partitioned member cannot silently starve them.
package watch

import (
	"context"
	"errors"
	"fmt"
	"hash/fnv"
	"log/slog"
	"sync/atomic"
	"time"

	"go.etcd.io/etcd/api/v3/etcdserverpb"
	"go.etcd.io/etcd/api/v3/mvccpb"
	"go.etcd.io/etcd/api/v3/v3rpc/rpctypes"
	clientv3 "go.etcd.io/etcd/client/v3"

	"github.com/regcluster/registry/cache"
	"github.com/regcluster/registry/internal/backoff"
	"github.com/regcluster/registry/internal/configerr"
	"github.com/regcluster/registry/internal/epoch"
	"github.com/regcluster/registry/internal/etcdread"
	registryv1 "github.com/regcluster/registry/proto/registry/v1"
	"github.com/regcluster/registry/record"
)

// ErrInvalidConfig is wrapped by every error of Config.Validate, and so
// of New: a setting that cannot work (see package configerr).
var ErrInvalidConfig = errors.New("watch: invalid config")

// Config configures a Watcher. A zero field takes the default its comment
// states (DefaultConfig has them all); a negative one is refused.
type Config struct {
	// Client is the etcd client (required); the Watcher does not close it.
	Client *clientv3.Client
	// Prefix is the registry key prefix ("": record.DefaultPrefix); the
	// Watcher follows <Prefix>instances/.
	Prefix string
	// Service, if set, narrows the watch to one service; it must be a
	// valid service name (record.ValidService).
	Service string
	// PageSize is the keys of a list's first range read, and the least of
	// each later one (0: 1000; one read is then at most about 16 MiB of
	// records at their size cap). Later reads grow to about PageBytes of
	// records at the size seen, at most ten times PageSize
	// (etcdread.Range).
	PageSize int64
	// PageBytes is what a list's later range reads grow to, in bytes of
	// records (0: etcdread.PageBytes, 2 MiB; below one record's size,
	// every read is PageSize keys).
	PageBytes int64
	// MinBackoff and MaxBackoff bound the wait before a retry (0: 100ms
	// and 5s, or MinBackoff if larger: quick enough after a blip, slow
	// enough not to hammer a struggling etcd); each wait is jittered.
	// MaxBackoff must be at least MinBackoff.
	MinBackoff, MaxBackoff time.Duration
	// ProgressInterval: with no response for this long, the Watcher
	// delivers one progress batch (a heartbeat at etcd's revision, read
	// linearizably), or asks etcd for a progress notification when etcd is
	// ahead of the view (0: 1s, well inside the SDK's 3s receive
	// deadline). An idle registry hears one heartbeat per interval, plus
	// etcd's own progress notifications.
	ProgressInterval time.Duration
	// Logger (nil: slog.Default()).
	Logger *slog.Logger
	// OnJunk, if set, is called for every record that is not a valid
	// instance (from Run's goroutine, or the one decoding a list).
	OnJunk func(key string, err error)
	// EpochKey, if set, is where the epoch of the history lives (see
	// internal/epoch): every snapshot carries the epoch it was read at, the
	// Watcher creates it if absent and replaces it when it finds etcd
	// restored under it, and checks it at least every ProgressInterval.
	EpochKey string
	// OnRestart, if set, is called each time the watch is re-established,
	// with the reason: "error", "compacted", "new-epoch", "closed".
	OnRestart func(reason string, err error)
	// Known, if set, is what a relist may take for a record instead of
	// decoding it: the instance the caller already holds for key at
	// exactly these mod and create revisions (the same put of the same
	// etcd history, so the same bytes), or nil. A relist after a
	// compaction then decodes only what changed. It is called from the
	// list's decoding goroutine, while nothing is delivered; a list that
	// turns out to be of another history is read again without it.
	Known func(key string, modRev, createRev int64) *registryv1.Instance
}

// DefaultConfig is a Config with every default but the client.
func DefaultConfig() Config {
	return Config{Prefix: record.DefaultPrefix, PageSize: 1000, PageBytes: etcdread.PageBytes, MinBackoff: 100 * time.Millisecond,
		MaxBackoff: 5 * time.Second, ProgressInterval: time.Second}
}

// withDefaults is c with its zero fields set to DefaultConfig's: the one
// place defaults are filled, for Validate and New.
func (c Config) withDefaults() Config {
	d := DefaultConfig()
	if c.Prefix == "" {
		c.Prefix = d.Prefix
	}
	if c.PageSize == 0 {
		c.PageSize = d.PageSize
	}
	if c.PageBytes == 0 {
		c.PageBytes = d.PageBytes
	}
	if c.MinBackoff == 0 {
		c.MinBackoff = d.MinBackoff
	}
	if c.MaxBackoff == 0 {
		c.MaxBackoff = max(d.MaxBackoff, c.MinBackoff)
	}
	if c.ProgressInterval == 0 {
		c.ProgressInterval = d.ProgressInterval
	}
	if c.Logger == nil {
		c.Logger = slog.Default()
	}
	return c
}

// Validate reports the first field that cannot work, with its defaults
// filled, as a *configerr.Error wrapping ErrInvalidConfig.
func (c Config) Validate() error {
	c = c.withDefaults()
	bad := func(field string, v any, rule string) error {
		return configerr.New(ErrInvalidConfig, "watch", field, v, rule)
	}
	switch {
	case c.Client == nil:
		return configerr.Required(ErrInvalidConfig, "watch", "Client")
	case c.PageSize < 0:
		return bad("PageSize", c.PageSize, "must be >= 0 (0: the default)")
	case c.PageBytes < 0:
		return bad("PageBytes", c.PageBytes, "must be >= 0 (0: the default)")
	case c.MinBackoff < 0:
		return bad("MinBackoff", c.MinBackoff, "must be >= 0 (0: the default)")
	case c.MaxBackoff < c.MinBackoff:
		return bad("MaxBackoff", c.MaxBackoff, fmt.Sprintf("must be >= MinBackoff %s (0: the default)", c.MinBackoff))
	case c.ProgressInterval < 0:
		return bad("ProgressInterval", c.ProgressInterval, "must be >= 0 (0: the default)")
	}
	if c.Service != "" {
		if err := record.ValidService(c.Service); err != nil {
			return configerr.Because(ErrInvalidConfig, "watch", "Service", c.Service, err)
		}
	}
	return nil
}

// Watcher follows the instances under a prefix. Run it once.
type Watcher struct {
	cfg    Config
	keys   record.Keys
	prefix string
	log    *slog.Logger
	dec    etcdread.Decoder // logs and reports junk

	rev       int64  // last delivered revision
	clusterID uint64 // cluster the last delivery came from
	epoch     string // epoch of the last snapshot delivered (with EpochKey)
	lastCheck time.Time
	// mark is the newest put delivered: etcd must still hold it at its
	// revision, or the revisions delivered are of another history (etcd
	// restored and already past them).
	mark mark
	// suspect: a check found etcd on another history; the next list
	// starts a new epoch even if the revision did not go down.
	suspect bool
}

// mark is one put: its key, its revision and a hash of its value.
type mark struct {
	key string
	rev int64
	sum uint64
}

func markOf(kv *mvccpb.KeyValue) mark {
	h := fnv.New64a()
	h.Write(kv.Value)
	return mark{key: string(kv.Key), rev: kv.ModRevision, sum: h.Sum64()}
}

// New returns a Watcher; it fails only if cfg does not Validate.
func New(cfg Config) (*Watcher, error) {
	if err := cfg.Validate(); err != nil {
		return nil, err
	}
	cfg = cfg.withDefaults()
	keys := record.NewKeys(cfg.Prefix)
	prefix := keys.Instances()
	if cfg.Service != "" {
		prefix = keys.Service(cfg.Service)
	}
	log := cfg.Logger.With("watch", prefix)
	return &Watcher{cfg: cfg, keys: keys, prefix: prefix, log: log, dec: etcdread.Decoder{Keys: keys, Log: log, OnJunk: cfg.OnJunk}}, nil
}

// Deliver receives batches in revision order, from Run's goroutine. An
// error it returns stops Run.
type Deliver func(cache.Batch) error

// errStop wraps an error returned by Deliver, so Run can tell it apart.
type errStop struct{ err error }

func (e errStop) Error() string { return e.err.Error() }

// Run lists, delivers the snapshot, then watches and delivers every change
// until ctx ends (it returns ctx.Err()) or deliver fails (it returns that
// error). Every etcd failure is retried.
func (w *Watcher) Run(ctx context.Context, deliver Deliver) error {
	needList := true
	for attempt := 0; ; {
		if err := ctx.Err(); err != nil {
			return err
		}
		var err error
		if needList {
			err = w.list(ctx, deliver)
			if err == nil {
				needList = false
			}
		} else {
			needList, err = w.watch(ctx, deliver)
		}
		var stop errStop
		if errors.As(err, &stop) {
			return stop.err
		}
		if ctx.Err() != nil {
			return ctx.Err()
		}
		if err == nil {
			attempt = 0
			continue
		}
		reason := "error"
		if needList {
			reason = "relist"
		}
		w.log.Warn("etcd watch interrupted; retrying", "reason", reason, "revision", w.rev, "err", err)
		if w.cfg.OnRestart != nil {
			w.cfg.OnRestart(reason, err)
		}
		if needList && attempt == 0 {
			// etcd answered (compacted, or another epoch): relist at once;
			// only a relist that fails again backs off.
			attempt++
			continue
		}
		if !sleep(ctx, w.backoff(attempt)) {
			return ctx.Err()
		}
		attempt++
	}
}

func (w *Watcher) backoff(attempt int) time.Duration {
	return backoff.Exponential{Min: w.cfg.MinBackoff, Max: w.cfg.MaxBackoff}.Delay(attempt)
}

var sleep = backoff.Sleep

// list reads the whole prefix at one revision and delivers it as a
// snapshot (a reset if anything was delivered before). With EpochKey it
// reads the epoch at the same revision; an absent epoch is created, and an
// unchanged one on an etcd that is evidently another history (another
// cluster, or a revision below the one delivered) is replaced, before the
// list is read again.
func (w *Watcher) list(ctx context.Context, deliver Deliver) error {
	reuse := true
	for tries := 0; ; tries++ {
		l, err := w.read(ctx, reuse)
		if err != nil {
			return err
		}
		rev, cid, ep := l.rev, l.cid, l.ep
		suspect := w.rev != 0 && (w.epochChanged(cid, rev) || w.suspect)
		if w.cfg.EpochKey != "" && (ep == "" || suspect && ep == w.epoch) {
			if tries >= 3 {
				return fmt.Errorf("epoch %s still %q after %d replacements", w.cfg.EpochKey, ep, tries)
			}
			next, err := epoch.Replace(clientv3.WithRequireLeader(ctx), w.cfg.Client, w.cfg.EpochKey, ep)
			if err != nil {
				return err
			}
			w.log.Warn("started a new epoch", "old", ep, "new", next, "etcd_revision", rev)
			continue
		}
		newEpoch := w.rev != 0 && (ep != w.epoch || w.cfg.EpochKey == "" && suspect)
		if newEpoch && l.reused > 0 {
			// Revisions of the old history name other records in this
			// one: decode everything.
			reuse = false
			continue
		}
		if newEpoch && ep != w.epoch {
			w.log.Error("etcd epoch changed: starting a new epoch, the revision may go down",
				"old_epoch", w.epoch, "new_epoch", ep, "delivered", w.rev, "etcd", rev)
		}
		b := cache.Batch{Revision: rev, Snapshot: true, Reset: w.rev != 0, NewEpoch: newEpoch, Epoch: ep,
			Instances: l.insts, Encoded: l.encoded}
		if err := deliver(b); err != nil {
			return errStop{err}
		}
		w.rev, w.clusterID, w.epoch, w.mark, w.suspect = rev, cid, ep, l.newest, false
		return nil
	}
}

// read lists the prefix page by page at one revision, and the epoch at the
// same revision.
//
// The records are decoded by a goroutine of read's, a page behind the
// reading: etcd serves the next page while this one is decoded, instead
// of one after the other. With reuse, a record Config.Known holds is
// taken from it, not decoded.
func (w *Watcher) read(ctx context.Context, reuse bool) (l listing, err error) {
	known := w.cfg.Known
	if !reuse || w.rev == 0 {
		known = nil // nothing delivered yet: nothing to take
	}
	var (
		pages   = make(chan []*mvccpb.KeyValue, 2)
		decoded = make(chan struct{})
		failed  atomic.Bool // the read failed: decoding the rest is waste
		got     listing     // the decoder's: read once decoded is closed
	)
	go func() {
		defer close(decoded)
		for page := range pages {
			if failed.Load() {
				continue
			}
			for _, kv := range page {
				if kv.ModRevision > got.newest.rev {
					got.newest = markOf(kv)
				}
				if known != nil {
					if in := known(string(kv.Key), kv.ModRevision, kv.CreateRevision); in != nil {
						got.insts = append(got.insts, in)
						got.encoded = append(got.encoded, record.Element(encodedField, kv.Value, kv.CreateRevision, kv.ModRevision))
						got.reused++
						continue
					}
				}
				if in, e := w.decode(kv); in != nil {
					got.insts = append(got.insts, in)
					got.encoded = append(got.encoded, e)
				}
			}
		}
	}()
	var (
		header *etcdserverpb.ResponseHeader
		page   []*mvccpb.KeyValue
	)
	l.rev, header, err = etcdread.Range(clientv3.WithRequireLeader(ctx), w.cfg.Client, w.prefix, 0, w.cfg.PageSize, w.cfg.PageBytes, func(kv *mvccpb.KeyValue) {
		page = append(page, kv)
		if int64(len(page)) >= w.cfg.PageSize {
			pages <- page
			page = nil
		}
	})
	failed.Store(err != nil)
	if len(page) > 0 {
		pages <- page
	}
	close(pages)
	<-decoded
	if err != nil {
		return listing{}, err
	}
	l.insts, l.encoded, l.newest, l.reused = got.insts, got.encoded, got.newest, got.reused
	l.cid = header.ClusterId
	if w.cfg.EpochKey != "" {
		resp, err := w.cfg.Client.Get(clientv3.WithRequireLeader(ctx), w.cfg.EpochKey, clientv3.WithRev(l.rev))
		if err != nil {
			return listing{}, fmt.Errorf("read epoch %s at revision %d: %w", w.cfg.EpochKey, l.rev, err)
		}
		if len(resp.Kvs) > 0 {
			l.ep = string(resp.Kvs[0].Value)
		}
	}
	return l, nil
}

// listing is what read returns: the valid instances at rev, each with its
// element (parallel), the cluster id and epoch, and the newest put.
type listing struct {
	insts   []*registryv1.Instance
	encoded [][]byte
	rev     int64
	cid     uint64
	ep      string
	newest  mark
	reused  int // records taken from Config.Known
}

// epochChanged reports (loudly) an etcd that is not the one we followed:
// another cluster, or the same one restored to an older revision.
func (w *Watcher) epochChanged(cid uint64, rev int64) bool {
	switch {
	case w.clusterID != 0 && cid != w.clusterID:
		w.log.Error("etcd cluster id changed: starting a new epoch, the revision may go down",
			"old_cluster", fmt.Sprintf("%x", w.clusterID), "new_cluster", fmt.Sprintf("%x", cid), "revision", rev)
		return true
	case rev < w.rev:
		w.log.Error("etcd revision went down (restored from a backup?): starting a new epoch",
			"delivered", w.rev, "etcd", rev)
		return true
	}
	return false
}

// encodedField is the field number of cache.Event.Encoded's and
// cache.Batch.Encoded's elements (Snapshot.instances).
const encodedField = 1

// decode returns the instance kv holds and its element (record.Element),
// or nil, nil for junk: only a value that decoded and validated is ever
// forwarded as bytes.
func (w *Watcher) decode(kv *mvccpb.KeyValue) (*registryv1.Instance, []byte) {
	in, err := w.dec.Decode(kv)
	if err != nil {
		return nil, nil // logged and reported
	}
	return in, record.Element(encodedField, kv.Value, kv.CreateRevision, kv.ModRevision)
}

var errEpoch = errors.New("etcd epoch changed")

// watch follows changes from w.rev+1 until the stream breaks. relist is
// true when only a fresh list can continue (compaction, new epoch).
func (w *Watcher) watch(ctx context.Context, deliver Deliver) (relist bool, err error) {
	wctx, cancel := context.WithCancel(clientv3.WithRequireLeader(ctx))
	defer cancel()
	// Before resuming, check that this is still the etcd we followed: a
	// restored etcd would otherwise let a watch from w.rev+1 wait forever.
	if _, relist, err := w.checkEpoch(wctx); err != nil {
		return relist, err
	}
	wch := w.cfg.Client.Watch(wctx, w.prefix, clientv3.WithPrefix(), clientv3.WithRev(w.rev+1),
		clientv3.WithProgressNotify())
	idle := time.NewTimer(w.cfg.ProgressInterval)
	defer idle.Stop()
	// A busy stream never goes idle: check the epoch on a clock too, so a
	// restore another regnode noticed is noticed here within an interval.
	check := time.NewTicker(w.cfg.ProgressInterval)
	defer check.Stop()
	for {
		select {
		case <-check.C:
			if time.Since(w.lastCheck) < w.cfg.ProgressInterval/2 {
				continue
			}
			if _, relist, err := w.checkEpoch(wctx); err != nil {
				return relist, err
			}
			continue
		case <-idle.C:
			// A quiet stream may be a quiet registry, or an etcd restored
			// behind our back: etcd's client resumes a broken watch by
			// itself, and a watch of a revision the restored etcd has not
			// reached yet is silent (no events, no progress) forever.
			head, relist, err := w.checkEpoch(wctx)
			if err != nil {
				return relist, err
			}
			if head == w.rev {
				// etcd is exactly where our view is (a linearizable read
				// says so): confirm it. etcd itself sends no progress to a
				// watch that starts past its revision, which is what an
				// idle registry's watch is. This is the interval's one
				// heartbeat: asking etcd for progress as well would
				// deliver a second one a millisecond later (its answer,
				// once the watch has seen an event), so ask only when
				// etcd is ahead of the view.
				if err := deliver(cache.Batch{Revision: head}); err != nil {
					return false, errStop{err}
				}
			} else if err := w.cfg.Client.RequestProgress(wctx); err != nil && ctx.Err() == nil {
				// etcd moved (writes outside the prefix, or events on
				// their way): its answer, once the watcher is synced,
				// carries the revision.
				return false, fmt.Errorf("request progress: %w", err)
			}
			idle.Reset(w.cfg.ProgressInterval)
			continue
		case resp, ok := <-wch:
			if !ok {
				if ctx.Err() != nil {
					return false, ctx.Err()
				}
				return false, errors.New("watch channel closed")
			}
			idle.Reset(w.cfg.ProgressInterval)
			if resp.CompactRevision != 0 || errors.Is(resp.Err(), rpctypes.ErrCompacted) {
				return true, fmt.Errorf("revision %d compacted (etcd compacted to %d)", w.rev+1, resp.CompactRevision)
			}
			if err := resp.Err(); err != nil {
				return false, err
			}
			if resp.Canceled {
				return false, fmt.Errorf("watch canceled by etcd: %s", resp.CancelReason)
			}
			if resp.Header.ClusterId != 0 && resp.Header.ClusterId != w.clusterID {
				return true, fmt.Errorf("%w: watch answered by cluster %x", errEpoch, resp.Header.ClusterId)
			}
			if resp.Created {
				continue
			}
			if resp.IsProgressNotify() {
				if resp.Header.Revision < w.rev {
					return true, fmt.Errorf("%w: progress at %d below delivered %d", errEpoch, resp.Header.Revision, w.rev)
				}
				// Delivered even when the revision did not move: it
				// confirms the view is current (a heartbeat).
				if err := deliver(cache.Batch{Revision: resp.Header.Revision}); err != nil {
					return false, errStop{err}
				}
				w.rev = resp.Header.Revision
				continue
			}
			if err := w.deliverEvents(resp.Events, deliver); err != nil {
				return false, err
			}
		}
	}
}

// checkEpoch reads etcd's header, the epoch and the newest put delivered
// (one linearizable txn) and returns etcd's revision; relist is true if it
// is another cluster, the same one at a revision below what was delivered,
// on another epoch, or without that put at its revision (restored, and
// already past what was delivered).
func (w *Watcher) checkEpoch(ctx context.Context) (rev int64, relist bool, err error) {
	w.lastCheck = time.Now()
	key := w.cfg.EpochKey
	if key == "" {
		key = w.prefix + "\x00epoch-check"
	}
	ops := []clientv3.Op{clientv3.OpGet(key)}
	if w.mark.rev != 0 {
		ops = append(ops, clientv3.OpGet(w.mark.key, clientv3.WithRev(w.mark.rev)))
	}
	head, err := w.cfg.Client.Txn(ctx).Then(ops...).Commit()
	switch {
	case errors.Is(err, rpctypes.ErrCompacted):
		// The mark's revision is compacted: it can no longer be checked.
		w.mark = mark{}
		return w.checkEpoch(ctx)
	case errors.Is(err, rpctypes.ErrFutureRev):
		w.suspect = true
		return 0, true, fmt.Errorf("%w: revision %d delivered is in etcd's future", errEpoch, w.mark.rev)
	case err != nil:
		return 0, false, fmt.Errorf("check etcd: %w", err)
	}
	if head.Header.ClusterId != w.clusterID || head.Header.Revision < w.rev {
		return 0, true, fmt.Errorf("%w: cluster %x at revision %d, delivered %x at %d", errEpoch,
			head.Header.ClusterId, head.Header.Revision, w.clusterID, w.rev)
	}
	if w.mark.rev != 0 {
		kvs := head.Responses[1].GetResponseRange().GetKvs()
		if len(kvs) == 0 || markOf(kvs[0]) != w.mark {
			w.suspect = true
			return 0, true, fmt.Errorf("%w: etcd does not hold the put of %s at revision %d that was delivered", errEpoch, w.mark.key, w.mark.rev)
		}
	}
	if w.cfg.EpochKey != "" {
		ep := ""
		if kvs := head.Responses[0].GetResponseRange().GetKvs(); len(kvs) > 0 {
			ep = string(kvs[0].Value)
		}
		if ep != w.epoch {
			return 0, true, fmt.Errorf("%w: epoch %q in etcd, delivered %q", errEpoch, ep, w.epoch)
		}
	}
	return head.Header.Revision, false, nil
}

// deliverEvents delivers events grouped by revision: one etcd transaction,
// one batch.
func (w *Watcher) deliverEvents(evs []*clientv3.Event, deliver Deliver) error {
	for i := 0; i < len(evs); {
		rev := evs[i].Kv.ModRevision
		var (
			batch []cache.Event
			put   *mvccpb.KeyValue // a put of this revision, for the mark
		)
		for ; i < len(evs) && evs[i].Kv.ModRevision == rev; i++ {
			ev := evs[i]
			if ev.Type == clientv3.EventTypePut {
				put = ev.Kv
			}
			key := string(ev.Kv.Key)
			service, id, ok := w.keys.Parse(key)
			if ev.Type == clientv3.EventTypeDelete {
				if ok {
					batch = append(batch, cache.Event{Type: cache.Delete, Service: service, ID: id})
				}
				continue
			}
			in, e := w.decode(ev.Kv)
			if in == nil {
				// Junk replaced a valid record: to readers the instance is
				// gone, exactly as List would show it.
				if ok {
					batch = append(batch, cache.Event{Type: cache.Delete, Service: service, ID: id})
				}
				continue
			}
			batch = append(batch, cache.Event{Type: cache.Put, Service: in.Service, ID: in.Id, Instance: in, Encoded: e})
		}
		if rev <= w.rev {
			continue // already delivered (a resumed stream may repeat)
		}
		if err := deliver(cache.Batch{Revision: rev, Events: batch}); err != nil {
			return errStop{err}
		}
		w.rev = rev
		if put != nil {
			w.mark = markOf(put)
		}
	}
	return nil
}

// Revision is the last revision delivered. It is only meaningful from the
// Deliver callback or after Run returns.
func (w *Watcher) Revision() int64 { return w.rev }
