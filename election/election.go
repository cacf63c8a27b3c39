// Package election elects one regnode to run the prober, on etcd's
// concurrency package, and fences what the leader writes.
//
// A leader holds a key under the election prefix, attached to its session
// lease. Every write a leader makes includes Leadership.Fence: a compare on
// that key's create revision. If the leader was deposed in the meantime
// (its process paused past the session TTL, a partition), the key is gone
// or another's, the compare fails, and the write does not land: a deposed
// leader can never write. Campaign in etcd's package does not re-check its
// key after winning, so a session that expired while campaigning could
// return "leader" holding nothing; Run watches the session while
// campaigning and re-checks the key before it leads.
package election

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"log/slog"
	"time"

	clientv3 "go.etcd.io/etcd/client/v3"
	"go.etcd.io/etcd/client/v3/concurrency"

	"github.com/regcluster/registry/internal/backoff"
	"github.com/regcluster/registry/internal/configerr"
	"github.com/regcluster/registry/record"
)

// Sentinel errors.
var (
	// ErrFenced is returned by a leader's work when a fenced write failed
	// because this node is no longer the leader; Run then campaigns again.
	ErrFenced = errors.New("fenced: no longer the leader")
	// ErrNoLeader means nobody leads right now.
	ErrNoLeader = errors.New("no leader")
)

// ErrInvalidConfig is wrapped by every error of Config.Validate, and so
// of New (see package configerr).
var ErrInvalidConfig = errors.New("election: invalid config")

// Config configures an Election. A zero field takes the default its
// comment states (DefaultConfig has them all).
type Config struct {
	// Client is the etcd client (required).
	Client *clientv3.Client
	// Prefix is the registry key prefix ("": record.DefaultPrefix); the
	// election runs on <prefix>election/prober.
	Prefix string
	// Name identifies this candidate to observers (required).
	Name string
	// SessionTTL is the leader's session TTL: a leader that stops renewing
	// is replaced after at most this long (0: 10s). etcd grants leases in
	// whole seconds, so it must be whole seconds; at least 2s, since the
	// session renews every TTL/3 and a shorter one expires on a slow
	// fsync.
	SessionTTL time.Duration
	// Logger (nil: slog.Default()).
	Logger *slog.Logger
	// OnLeaderChange, if set, is called when this candidate starts (true)
	// or stops (false) leading.
	OnLeaderChange func(leading bool)
}

// MinSessionTTL is the shortest Config.SessionTTL.
const MinSessionTTL = 2 * time.Second

// DefaultConfig is a Config with every default but the client and name.
func DefaultConfig() Config {
	return Config{Prefix: record.DefaultPrefix, SessionTTL: 10 * time.Second}
}

// withDefaults is c with its zero fields set to DefaultConfig's: the one
// place defaults are filled, for Validate and New.
func (c Config) withDefaults() Config {
	d := DefaultConfig()
	if c.Prefix == "" {
		c.Prefix = d.Prefix
	}
	if c.SessionTTL == 0 {
		c.SessionTTL = d.SessionTTL
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
	switch {
	case c.Client == nil:
		return configerr.Required(ErrInvalidConfig, "election", "Client")
	case c.Name == "":
		return configerr.Required(ErrInvalidConfig, "election", "Name")
	case c.SessionTTL < MinSessionTTL || c.SessionTTL%time.Second != 0:
		return configerr.New(ErrInvalidConfig, "election", "SessionTTL", c.SessionTTL,
			fmt.Sprintf("must be whole seconds, at least %s (0: the default)", MinSessionTTL))
	}
	return nil
}

// Election is one candidate. Run it once.
type Election struct {
	cfg    Config
	prefix string
	log    *slog.Logger
}

// New returns a candidate; it fails only if cfg does not Validate.
func New(cfg Config) (*Election, error) {
	if err := cfg.Validate(); err != nil {
		return nil, err
	}
	cfg = cfg.withDefaults()
	return &Election{cfg: cfg, prefix: record.NewKeys(cfg.Prefix).Election(), log: cfg.Logger.With("election", cfg.Name)}, nil
}

// Leadership is held by the leader while it leads.
type Leadership struct {
	// Key is the leader's key; Rev is its create revision, the fence.
	Key string
	Rev int64
	// Since is when this leadership began.
	Since time.Time
	// Name is the leader's name.
	Name string
}

// Fence is the compare every write of the leader must include: true only
// while this leadership's key still exists as created.
func (l *Leadership) Fence() clientv3.Cmp {
	return clientv3.Compare(clientv3.CreateRevision(l.Key), "=", l.Rev)
}

// Held reports, with one linearizable read, whether the fence still holds.
func (l *Leadership) Held(ctx context.Context, cli *clientv3.Client) (bool, error) {
	resp, err := cli.Txn(ctx).If(l.Fence()).Commit()
	if err != nil {
		return false, fmt.Errorf("check leadership: %w", err)
	}
	return resp.Succeeded, nil
}

// value is what the leader's key holds, for observers.
type value struct {
	Name  string    `json:"name"`
	Since time.Time `json:"since"`
}

// Lead is the work done while leading. Its ctx ends when leadership is
// lost (session expired) or Run's ctx ends; it returns ErrFenced if one of
// its fenced writes failed.
type Lead func(ctx context.Context, l *Leadership) error

// Run campaigns, runs lead while leading, and campaigns again when
// leadership is lost, until ctx ends. Then it resigns and revokes its
// session, so another candidate takes over at once.
func (e *Election) Run(ctx context.Context, lead Lead) error {
	for attempt := 0; ; attempt++ {
		err := e.term(ctx, lead)
		if ctx.Err() != nil {
			return ctx.Err()
		}
		if err != nil {
			e.log.Warn("leadership term ended", "err", err)
		}
		wait := termBackoff.Delay(attempt)
		if errors.Is(err, ErrFenced) || err == nil {
			wait, attempt = 0, 0
		}
		select {
		case <-time.After(wait):
		case <-ctx.Done():
			return ctx.Err()
		}
	}
}

// termBackoff spaces the terms after one that failed (jittered, so the
// regnodes of a cluster that lost etcd together do not campaign in step).
var termBackoff = backoff.Exponential{Min: 200 * time.Millisecond, Max: 2 * time.Second}

// term is one session: campaign, lead, resign.
func (e *Election) term(ctx context.Context, lead Lead) error {
	// The grant is made here, under ctx, so a stop while etcd is
	// unreachable ends the wait (concurrency.NewSession would grant under
	// its WithContext context, which also bounds the session's keepalive
	// and its Close: a cancelled one would not let it resign).
	ttl := int64(e.cfg.SessionTTL / time.Second)
	grant, err := e.cfg.Client.Grant(ctx, ttl)
	if err != nil {
		return fmt.Errorf("grant the election session's lease (ttl %ds): %w", ttl, err)
	}
	sess, err := concurrency.NewSession(e.cfg.Client, concurrency.WithLease(grant.ID), concurrency.WithTTL(int(ttl)))
	if err != nil {
		return fmt.Errorf("open election session on lease %x: %w", grant.ID, err)
	}
	defer func() {
		// Revoking the lease deletes our key: whoever campaigns next wins
		// now, not a session TTL from now.
		cctx, cancel := context.WithTimeout(context.Background(), 2*time.Second)
		defer cancel()
		if _, err := e.cfg.Client.Revoke(cctx, sess.Lease()); err != nil {
			e.log.Debug("revoke election session", "err", err)
		}
		sess.Orphan()
	}()
	el := concurrency.NewElection(sess, e.prefix)
	since := time.Now()
	val, _ := json.Marshal(value{Name: e.cfg.Name, Since: since})

	// Campaign, but give up if the session dies meanwhile.
	cctx, cancel := whileAlive(ctx, sess)
	err = el.Campaign(cctx, string(val))
	cancel()
	if err != nil {
		return fmt.Errorf("campaign: %w", err)
	}
	select {
	case <-sess.Done():
		return errors.New("session expired while campaigning")
	default:
	}
	l := &Leadership{Key: el.Key(), Rev: el.Rev(), Since: time.Now(), Name: e.cfg.Name}
	// Re-check the key: Campaign does not, and it may have expired with a
	// session that lapsed just as we won.
	if ok, err := l.Held(ctx, e.cfg.Client); err != nil || !ok {
		return fmt.Errorf("won the campaign but the leader key is gone (held=%v): %w", ok, errors.Join(err, ErrFenced))
	}
	e.log.Info("leading", "key", l.Key, "fence", l.Rev)
	if e.cfg.OnLeaderChange != nil {
		e.cfg.OnLeaderChange(true)
		defer e.cfg.OnLeaderChange(false)
	}
	lctx, lcancel := whileAlive(ctx, sess)
	err = lead(lctx, l)
	lcancel()
	select {
	case <-sess.Done():
		e.log.Warn("leadership lost: session expired", "fence", l.Rev)
		return errors.Join(err, ErrFenced)
	default:
	}
	e.log.Info("stepping down", "fence", l.Rev, "err", err)
	return err
}

// whileAlive returns a context that ends with ctx or when the session is
// no longer kept alive. (Session.Ctx is not it: that context ends only on
// Close; Done is what closes when the lease expires or is lost.) The
// goroutine it starts ends when the returned cancel is called.
func whileAlive(ctx context.Context, sess *concurrency.Session) (context.Context, context.CancelFunc) {
	c, cancel := context.WithCancel(ctx)
	done := make(chan struct{})
	go func() {
		defer close(done)
		select {
		case <-sess.Done():
			cancel()
		case <-c.Done():
		}
	}()
	return c, func() { cancel(); <-done }
}

// Leader is who leads and since when.
type Leader struct {
	Name  string
	Since time.Time
	// Rev is the leader key's create revision (its fence).
	Rev int64
}

// CurrentLeader reads the leader (ErrNoLeader if none).
func CurrentLeader(ctx context.Context, cli *clientv3.Client, prefix string) (Leader, error) {
	key := record.NewKeys(prefix).Election()
	resp, err := cli.Get(ctx, key+"/", append([]clientv3.OpOption{clientv3.WithPrefix()}, clientv3.WithFirstCreate()...)...)
	if err != nil {
		return Leader{}, fmt.Errorf("read election leader: %w", err)
	}
	if len(resp.Kvs) == 0 {
		return Leader{}, ErrNoLeader
	}
	kv := resp.Kvs[0]
	var v value
	if err := json.Unmarshal(kv.Value, &v); err != nil {
		return Leader{Name: string(kv.Value), Rev: kv.CreateRevision}, nil
	}
	return Leader{Name: v.Name, Since: v.Since, Rev: kv.CreateRevision}, nil
}
