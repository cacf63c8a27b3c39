// Package txnbatch group-commits independent conditional writes to etcd.
//
// Concurrent Do calls are sent as ONE etcd Txn whose every member is a
// nested transaction (clientv3.OpTxn) with its own compares, Then and Else:
// etcd evaluates each member's compares on their own, so a member takes
// the branch it would have taken committed alone, whatever the others do
// (one failed compare fails nobody else), while the whole batch costs one
// raft proposal, one fsync and one revision.
//
// Two things can still fail a whole etcd Txn for one member's sake: a put
// under a lease etcd no longer has, and a request etcd refuses as a whole
// (too large, too many ops). A batch that fails so is committed again
// member by member, so the fault stays the faulty member's. Members that
// write a common key never share a batch (etcd refuses a Txn that puts a
// key twice); the later one goes in the next.
package txnbatch

import (
	"context"
	"errors"
	"log/slog"
	"sync"
	"sync/atomic"
	"time"

	pb "go.etcd.io/etcd/api/v3/etcdserverpb"
	"go.etcd.io/etcd/api/v3/v3rpc/rpctypes"
	clientv3 "go.etcd.io/etcd/client/v3"
	"google.golang.org/grpc/codes"

	"github.com/regcluster/registry/internal/configerr"
)

// ErrClosed is returned by Do on a closed Batcher.
var ErrClosed = errors.New("txnbatch: closed")

// Op is one conditional write: If all its compares hold, Then, else Else,
// exactly as a Txn of its own would.
type Op struct {
	If         []clientv3.Cmp
	Then, Else []clientv3.Op
}

// Result is how an Op ended: the branch it took and that branch's
// responses, and the revision of the Txn that carried it (every write of
// one batch lands at that revision).
type Result struct {
	Succeeded bool
	Responses []*pb.ResponseOp
	Revision  int64
}

// Config configures a Batcher.
type Config struct {
	// Client commits the batches (required; not closed by the Batcher).
	Client *clientv3.Client
	// MaxOps bounds the members of one batch (default 64; etcd refuses a
	// Txn of more than its --max-txn-ops, 128 by default).
	MaxOps int
	// MaxBytes bounds the keys and values of one batch (default 1 MiB;
	// etcd refuses a request over its --max-request-bytes, 1.5 MiB by
	// default).
	MaxBytes int
	// InFlight is how many batches may be committing at once (default 2):
	// while one is in etcd the next gathers the calls that arrive.
	InFlight int
	// Linger, if set, is how long a batch waits for more members once it
	// has one and nothing more is queued (a commit delay); 0 commits what
	// is queued at once, so a lone call is never held.
	Linger time.Duration
	// Timeout bounds each etcd Txn (default 5s).
	Timeout time.Duration
	// Logger (default slog.Default()).
	Logger *slog.Logger
}

// DefaultConfig is a Config with every default but the client.
func DefaultConfig() Config {
	return Config{MaxOps: 64, MaxBytes: 1 << 20, InFlight: 2, Timeout: 5 * time.Second}
}

// ErrInvalidConfig is wrapped by every error of Config.Validate, and so
// of New (see package configerr).
var ErrInvalidConfig = errors.New("txnbatch: invalid config")

// withDefaults is c with its zero fields set to DefaultConfig's: the one
// place defaults are filled, for Validate and New.
func (c Config) withDefaults() Config {
	d := DefaultConfig()
	if c.MaxOps == 0 {
		c.MaxOps = d.MaxOps
	}
	if c.MaxBytes == 0 {
		c.MaxBytes = d.MaxBytes
	}
	if c.InFlight == 0 {
		c.InFlight = d.InFlight
	}
	if c.Timeout == 0 {
		c.Timeout = d.Timeout
	}
	if c.Logger == nil {
		c.Logger = slog.Default()
	}
	return c
}

// Validate reports a missing client, a negative bound or a MaxOps over
// etcd's default --max-txn-ops, with the defaults filled, as a
// *configerr.Error wrapping ErrInvalidConfig.
func (c Config) Validate() error {
	c = c.withDefaults()
	bad := func(field string, v any, rule string) error {
		return configerr.New(ErrInvalidConfig, "txnbatch", field, v, rule)
	}
	const neg = "must be >= 0 (0: the default)"
	switch {
	case c.Client == nil:
		return configerr.Required(ErrInvalidConfig, "txnbatch", "Client")
	case c.MaxOps < 0:
		return bad("MaxOps", c.MaxOps, neg)
	case c.MaxOps > 128:
		return bad("MaxOps", c.MaxOps, "must be at most etcd's default --max-txn-ops 128")
	case c.MaxBytes < 0:
		return bad("MaxBytes", c.MaxBytes, neg)
	case c.InFlight < 0:
		return bad("InFlight", c.InFlight, neg)
	case c.Linger < 0:
		return bad("Linger", c.Linger, "must be >= 0 (0: commit at once)")
	case c.Timeout < 0:
		return bad("Timeout", c.Timeout, neg)
	}
	return nil
}

// Stats counts what a Batcher committed.
type Stats struct {
	// Txns is the etcd Txns sent (batches, and members sent again alone);
	// Members, the Ops they carried; Split, batches committed again
	// member by member.
	Txns, Members, Split int64
}

// Batcher group-commits Ops. Safe for concurrent use.
type Batcher struct {
	cfg   Config
	log   *slog.Logger
	calls chan *call
	done  chan struct{} // closed by Close
	once  sync.Once
	wg    sync.WaitGroup

	txns, members, split atomic.Int64
}

type call struct {
	ctx  context.Context
	op   Op
	keys []string
	size int
	res  chan outcome // buffered: a reply never blocks a committer
}

type outcome struct {
	r   Result
	err error
}

// New starts a Batcher; Close stops it.
func New(cfg Config) (*Batcher, error) {
	if err := cfg.Validate(); err != nil {
		return nil, err
	}
	cfg = cfg.withDefaults()
	b := &Batcher{cfg: cfg, log: cfg.Logger, calls: make(chan *call, 4*cfg.MaxOps), done: make(chan struct{})}
	for range cfg.InFlight {
		b.wg.Add(1)
		go b.committer()
	}
	return b, nil
}

// Stats returns the counts so far.
func (b *Batcher) Stats() Stats {
	return Stats{Txns: b.txns.Load(), Members: b.members.Load(), Split: b.split.Load()}
}

// Do commits op, alone or with others, and returns the branch it took. An
// error means op's Txn failed or may not have landed (as a Txn's error
// would); a call whose ctx ends before its batch is sent is not sent.
func (b *Batcher) Do(ctx context.Context, op Op) (Result, error) {
	c := &call{ctx: ctx, op: op, res: make(chan outcome, 1)}
	for _, o := range append(append([]clientv3.Op(nil), op.Then...), op.Else...) {
		if o.IsPut() || o.IsDelete() {
			c.keys = append(c.keys, string(o.KeyBytes()))
		}
		c.size += len(o.KeyBytes()) + len(o.ValueBytes())
	}
	select {
	case b.calls <- c:
	case <-ctx.Done():
		return Result{}, ctx.Err()
	case <-b.done:
		return Result{}, ErrClosed
	}
	select {
	case o := <-c.res:
		return o.r, o.err
	case <-ctx.Done():
		return Result{}, ctx.Err()
	case <-b.done:
		select {
		case o := <-c.res:
			return o.r, o.err
		default:
			return Result{}, ErrClosed
		}
	}
}

// Commit is Do with the Txn's parts as arguments and the Result's as
// results: what store.Committer asks of it.
func (b *Batcher) Commit(ctx context.Context, cmps []clientv3.Cmp, then, els []clientv3.Op) (bool, []*pb.ResponseOp, int64, error) {
	r, err := b.Do(ctx, Op{If: cmps, Then: then, Else: els})
	return r.Succeeded, r.Responses, r.Revision, err
}

// Close stops taking calls, lets batches being committed finish, and
// fails calls still queued with ErrClosed. Idempotent.
func (b *Batcher) Close() {
	b.once.Do(func() { close(b.done) })
	b.wg.Wait()
	for {
		select {
		case c := <-b.calls:
			c.res <- outcome{err: ErrClosed}
		default:
			return
		}
	}
}

// committer gathers a batch (the first call waiting, then whatever else is
// queued, up to the bounds) and commits it, until Close.
func (b *Batcher) committer() {
	defer b.wg.Done()
	var next *call // a call that could not join the last batch
	for {
		first := next
		next = nil
		if first == nil {
			select {
			case first = <-b.calls:
			case <-b.done:
				return
			}
		}
		batch := []*call{first}
		keys := map[string]bool{}
		for _, k := range first.keys {
			keys[k] = true
		}
		size := first.size
		var (
			linger <-chan time.Time
			timer  *time.Timer
		)
		if b.cfg.Linger > 0 {
			timer = time.NewTimer(b.cfg.Linger)
			linger = timer.C
		}
	gather:
		for len(batch) < b.cfg.MaxOps {
			var c *call
			select {
			case c = <-b.calls:
			default:
				if linger == nil {
					break gather
				}
				select {
				case c = <-b.calls:
				case <-linger:
					break gather
				case <-b.done:
					break gather
				}
			}
			if size+c.size > b.cfg.MaxBytes || overlaps(keys, c.keys) {
				next = c
				break
			}
			batch = append(batch, c)
			for _, k := range c.keys {
				keys[k] = true
			}
			size += c.size
		}
		if timer != nil {
			timer.Stop()
		}
		b.commit(batch)
	}
}

func overlaps(keys map[string]bool, ks []string) bool {
	for _, k := range ks {
		if keys[k] {
			return true
		}
	}
	return false
}

// commit sends the live members of batch as one Txn and answers each.
func (b *Batcher) commit(batch []*call) {
	live := batch[:0]
	for _, c := range batch {
		if err := c.ctx.Err(); err != nil {
			c.res <- outcome{err: err}
			continue
		}
		live = append(live, c)
	}
	switch len(live) {
	case 0:
		return
	case 1:
		b.alone(live[0])
		return
	}
	ops := make([]clientv3.Op, len(live))
	for i, c := range live {
		ops[i] = clientv3.OpTxn(c.op.If, c.op.Then, c.op.Else)
	}
	ctx, cancel := context.WithTimeout(context.Background(), b.cfg.Timeout)
	resp, err := b.cfg.Client.Txn(ctx).Then(ops...).Commit()
	cancel()
	b.txns.Add(1)
	b.members.Add(int64(len(live)))
	if err != nil {
		if !memberFault(err) {
			for _, c := range live {
				c.res <- outcome{err: err}
			}
			return
		}
		// One member's fault failed them all: each goes alone, so it
		// fails only its own.
		b.split.Add(1)
		b.log.Debug("batch refused as a whole; committing its members one by one", "members", len(live), "err", err)
		var wg sync.WaitGroup
		for _, c := range live {
			wg.Add(1)
			go func() {
				defer wg.Done()
				b.alone(c)
			}()
		}
		wg.Wait()
		return
	}
	for i, c := range live {
		r := resp.Responses[i].GetResponseTxn()
		c.res <- outcome{r: Result{Succeeded: r.GetSucceeded(), Responses: r.GetResponses(), Revision: resp.Header.Revision}}
	}
}

// alone commits one call as a Txn of its own.
func (b *Batcher) alone(c *call) {
	ctx, cancel := context.WithTimeout(c.ctx, b.cfg.Timeout)
	defer cancel()
	resp, err := b.cfg.Client.Txn(ctx).If(c.op.If...).Then(c.op.Then...).Else(c.op.Else...).Commit()
	b.txns.Add(1)
	b.members.Add(1)
	if err != nil {
		c.res <- outcome{err: err}
		return
	}
	c.res <- outcome{r: Result{Succeeded: resp.Succeeded, Responses: resp.Responses, Revision: resp.Header.Revision}}
}

// memberFault says err is etcd refusing the Txn for what one member asked
// (a lease it no longer has, a request too big), not etcd failing.
func memberFault(err error) bool {
	for _, e := range []error{rpctypes.ErrLeaseNotFound, rpctypes.ErrDuplicateKey, rpctypes.ErrTooManyOps, rpctypes.ErrRequestTooLarge} {
		if errors.Is(err, e) {
			return true
		}
	}
	var ee rpctypes.EtcdError
	if errors.As(err, &ee) {
		switch ee.Code() {
		case codes.InvalidArgument, codes.NotFound, codes.FailedPrecondition:
			return true
		}
	}
	return false
}
