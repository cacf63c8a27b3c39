package lease

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"sync"
	"time"

	"google.golang.org/protobuf/proto"

	"github.com/regcluster/registry/internal/backoff"
	"github.com/regcluster/registry/internal/configerr"
	"github.com/regcluster/registry/internal/secret"
	registryv1 "github.com/regcluster/registry/proto/registry/v1"
	"github.com/regcluster/registry/record"
)

// Config tunes a Keeper. A zero field takes the default its comment states
// (DefaultConfig has them all); a negative one is refused.
type Config struct {
	// TTL is the lease TTL, record.MinTTL..record.MaxTTL (2s..1h; 0:
	// record.DefaultTTL, 10s): how long the instance outlives a process
	// that stopped renewing without deregistering.
	TTL time.Duration
	// KeepAliveInterval is how often the lease is renewed; it must be
	// shorter than TTL (0: TTL/3, so two renewals in a row can fail
	// before the lease expires).
	KeepAliveInterval time.Duration
	// DrainGrace is how long Close leaves the instance DRAINING before
	// deleting it, so that subscribers see it drain (0: 2s).
	DrainGrace time.Duration
	// MinBackoff and MaxBackoff bound the retry delay after a failure
	// (0: 100ms, and min(5s, TTL/2) but at least MinBackoff, so a lost
	// registration is retried well within its TTL); each wait is
	// jittered. MaxBackoff must be at least MinBackoff.
	MinBackoff, MaxBackoff time.Duration
	// Logger receives state changes (nil: slog.Default()).
	Logger *slog.Logger
	// OnChange, if set, is called with the new Status every time the
	// registration is made, lost or re-made. It runs on the Keeper's
	// goroutine and must not block.
	OnChange func(Status)
}

// DefaultConfig is the Config of a zero Config, for the default TTL. The
// KeepAliveInterval and MaxBackoff it states are those of its TTL: with
// another TTL, set them to 0 to have them derived from it.
func DefaultConfig() Config {
	return Config{TTL: record.DefaultTTL, KeepAliveInterval: record.DefaultTTL / 3, DrainGrace: 2 * time.Second,
		MinBackoff: 100 * time.Millisecond, MaxBackoff: min(5*time.Second, record.DefaultTTL/2)}
}

// withDefaults is c with its zero fields set to their defaults: the one
// place defaults are filled, for Validate and Start.
func (c Config) withDefaults() Config {
	d := DefaultConfig()
	if c.TTL == 0 {
		c.TTL = d.TTL
	}
	if c.KeepAliveInterval == 0 {
		c.KeepAliveInterval = c.TTL / 3
	}
	if c.DrainGrace == 0 {
		c.DrainGrace = d.DrainGrace
	}
	if c.MinBackoff == 0 {
		c.MinBackoff = d.MinBackoff
	}
	if c.MaxBackoff == 0 {
		c.MaxBackoff = max(min(5*time.Second, c.TTL/2), c.MinBackoff)
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
		return configerr.New(ErrInvalidConfig, "lease", field, v, rule)
	}
	if err := record.ValidTTL(c.TTL); err != nil {
		return configerr.Because(ErrInvalidConfig, "lease", "TTL", c.TTL, err)
	}
	switch {
	case c.KeepAliveInterval < 0:
		return bad("KeepAliveInterval", c.KeepAliveInterval, "must be >= 0 (0: TTL/3)")
	case c.KeepAliveInterval >= c.TTL:
		return bad("KeepAliveInterval", c.KeepAliveInterval, fmt.Sprintf("must be shorter than the TTL %s", c.TTL))
	case c.DrainGrace < 0:
		return bad("DrainGrace", c.DrainGrace, "must be >= 0 (0: the default)")
	case c.MinBackoff < 0:
		return bad("MinBackoff", c.MinBackoff, "must be >= 0 (0: the default)")
	case c.MaxBackoff < c.MinBackoff:
		return bad("MaxBackoff", c.MaxBackoff, fmt.Sprintf("must be >= MinBackoff %s (0: the default)", c.MinBackoff))
	}
	return nil
}

// Status is a registration's state at one moment.
type Status struct {
	// Registered is true while the instance is known to be in etcd under
	// a live lease: set on a successful register or renewal, cleared when
	// the lease is reported lost or has not been renewed for a whole TTL.
	Registered bool
	// LeaseID is the current (or last) lease.
	LeaseID int64
	// TTL is the lease TTL the backend granted.
	TTL time.Duration
	// Closed is true once Close has deregistered the instance, so an
	// OnChange callback can tell a graceful end from a lost lease.
	Closed bool
	// Since is when Registered last changed.
	Since time.Time
	// Registrations counts successful registrations, the first included.
	Registrations int
	// LastError is the last failure, nil after a success.
	LastError error
}

// Keeper is one live registration. Its methods are safe for concurrent use.
type Keeper struct {
	cfg     Config
	backend Backend
	log     *slog.Logger

	cancel context.CancelFunc
	done   chan struct{}

	closeOnce sync.Once
	closeErr  error

	mu struct {
		sync.Mutex
		inst *registryv1.Instance
		// secret is the registration's secret: it proves this handle
		// owns the id to KeepAlive, Deregister and a re-registration.
		// It lives only here, never in Status or a log.
		secret string
		status Status
		closed bool
		// pending: a Drain or Serve came while the record was gone (a
		// lost lease); the next registration applies it, since the
		// registry otherwise restores the lifecycle it saved.
		pending bool
	}
}

// Start registers inst under a new secret, held in memory only, and
// returns a Keeper that keeps it registered until Close. The first
// registration is retried until it succeeds or ctx ends; invalid input and
// an id owned by someone else fail at once.
func Start(ctx context.Context, b Backend, inst *registryv1.Instance, cfg Config) (*Keeper, error) {
	if err := cfg.Validate(); err != nil {
		return nil, err
	}
	c := cfg.withDefaults()
	if err := record.Validate(inst); err != nil {
		return nil, err
	}
	in := proto.CloneOf(inst)
	in.Incarnation = "" // grants nothing: the secret is the ownership
	k := &Keeper{cfg: c, backend: b, log: c.Logger.With("service", in.Service, "id", in.Id), done: make(chan struct{})}
	k.mu.inst = in
	// Made here, not by the backend, so that a first registration that
	// landed but whose answer was lost is still ours on the retry.
	k.mu.secret = secret.New()
	for attempt := 0; ; attempt++ {
		err := k.register(ctx)
		if err == nil {
			break
		}
		if permanent(err) {
			return nil, err
		}
		if !sleep(ctx, k.backoff(attempt)) {
			return nil, fmt.Errorf("register %s/%s: %w (last error: %w)", in.Service, in.Id, ctx.Err(), err)
		}
	}
	loopCtx, cancel := context.WithCancel(context.Background())
	k.cancel = cancel
	go k.run(loopCtx)
	return k, nil
}

func permanent(err error) bool {
	// A refusal that retrying cannot change (a token without the right,
	// say) tells so by a Permanent method somewhere in the chain.
	var p interface{ Permanent() bool }
	return errors.Is(err, record.ErrInvalid) || errors.Is(err, record.ErrAlreadyExists) ||
		errors.As(err, &p) && p.Permanent()
}

// backoff is jittered: it spreads the retries of many instances.
func (k *Keeper) backoff(attempt int) time.Duration {
	return backoff.Exponential{Min: k.cfg.MinBackoff, Max: k.cfg.MaxBackoff}.Delay(attempt)
}

var sleep = backoff.Sleep

func (k *Keeper) register(ctx context.Context) error {
	k.mu.Lock()
	inst, sec := proto.CloneOf(k.mu.inst), k.mu.secret
	k.mu.Unlock()
	rctx, cancel := context.WithTimeout(ctx, k.cfg.TTL)
	defer cancel()
	g, err := k.backend.Register(rctx, inst, k.cfg.TTL, sec)
	if err != nil {
		k.log.Warn("registration failed", "err", err)
		k.setStatus(func(s *Status) { s.LastError = err })
		return err
	}
	k.log.Info("registered", "lease", fmt.Sprintf("%x", g.LeaseID), "revision", g.Revision)
	if g.Secret != "" {
		k.mu.Lock()
		k.mu.secret = g.Secret
		k.mu.Unlock()
	}
	k.setStatus(func(s *Status) {
		s.Registered, s.LeaseID, s.TTL, s.LastError = true, g.LeaseID, g.TTL, nil
		s.Registrations++
	})
	k.applyPending(rctx)
	return nil
}

// applyPending writes a lifecycle change made while the record was gone.
// A failure leaves it pending for the next registration, and is logged:
// the registration itself stands.
func (k *Keeper) applyPending(ctx context.Context) {
	k.mu.Lock()
	pending := k.mu.pending
	service, id, lc, reason := k.mu.inst.Service, k.mu.inst.Id, k.mu.inst.Lifecycle, k.mu.inst.LifecycleReason
	k.mu.Unlock()
	if !pending {
		return
	}
	if err := k.backend.SetLifecycle(ctx, service, id, lc, reason); err != nil {
		k.log.Warn("lifecycle set while unregistered not applied yet", "lifecycle", lc.String(), "err", err)
		return
	}
	k.mu.Lock()
	// Unless another change came meanwhile: it is pending still.
	if k.mu.inst.Lifecycle == lc && k.mu.inst.LifecycleReason == reason {
		k.mu.pending = false
	}
	k.mu.Unlock()
}

func (k *Keeper) setStatus(f func(*Status)) {
	k.mu.Lock()
	before := k.mu.status
	f(&k.mu.status)
	if k.mu.status.Registered != before.Registered || k.mu.status.LeaseID != before.LeaseID {
		k.mu.status.Since = time.Now()
	}
	st := k.mu.status
	k.mu.Unlock()
	if k.cfg.OnChange != nil && (st.Registered != before.Registered || st.LeaseID != before.LeaseID) {
		k.cfg.OnChange(st)
	}
}

// run renews the lease and registers again whenever it is lost, until ctx
// is cancelled by Close.
func (k *Keeper) run(ctx context.Context) {
	defer close(k.done)
	lastRenewed := time.Now()
	failures := 0
	for {
		wait := k.cfg.KeepAliveInterval
		if failures > 0 {
			wait = min(wait, k.backoff(failures-1))
		}
		if !sleep(ctx, wait) {
			return
		}
		st := k.Status()
		if !st.Registered {
			if err := k.register(ctx); err != nil {
				failures++
				continue
			}
			failures, lastRenewed = 0, time.Now()
			continue
		}
		kctx, cancel := context.WithTimeout(ctx, k.cfg.KeepAliveInterval)
		_, err := k.backend.KeepAlive(kctx, k.owner(st.LeaseID))
		cancel()
		switch {
		case err == nil:
			failures, lastRenewed = 0, time.Now()
		case ctx.Err() != nil:
			return
		case errors.Is(err, ErrLeaseLost):
			k.log.Warn("lease lost; registering again", "lease", fmt.Sprintf("%x", st.LeaseID), "err", err)
			k.setStatus(func(s *Status) { s.Registered, s.LastError = false, err })
			failures = 0
			if k.register(ctx) != nil {
				failures = 1
			} else {
				lastRenewed = time.Now()
			}
		default:
			failures++
			k.log.Warn("lease renewal failed", "lease", fmt.Sprintf("%x", st.LeaseID), "err", err, "unrenewed_for", time.Since(lastRenewed).Round(time.Millisecond))
			// After a whole TTL without renewal the lease has expired as
			// far as etcd is concerned: stop claiming to be registered and
			// register again (the secret lets us replace our own
			// record if it did survive).
			expired := time.Since(lastRenewed) >= k.cfg.TTL
			k.setStatus(func(s *Status) {
				s.LastError = err
				if expired {
					s.Registered = false
				}
			})
		}
	}
}

// owner is what proves this registration is ours, with lease.
func (k *Keeper) owner(lease int64) Owner {
	k.mu.Lock()
	defer k.mu.Unlock()
	return Owner{Service: k.mu.inst.Service, ID: k.mu.inst.Id, LeaseID: lease, Secret: k.mu.secret}
}

// Status returns the registration's current state.
func (k *Keeper) Status() Status {
	k.mu.Lock()
	defer k.mu.Unlock()
	return k.mu.status
}

// Registered reports whether the instance is in etcd under a live lease
// right now, as far as this Keeper knows.
func (k *Keeper) Registered() bool { return k.Status().Registered }

// Instance returns the record as this Keeper registers it.
func (k *Keeper) Instance() *registryv1.Instance {
	k.mu.Lock()
	defer k.mu.Unlock()
	return proto.CloneOf(k.mu.inst)
}

// Drain marks the instance DRAINING (no new requests) with reason. It also
// holds across re-registrations: the registry keeps the lifecycle of a
// record registered again after a lost lease, and a Drain made while the
// record is gone is applied once it is back.
func (k *Keeper) Drain(ctx context.Context, reason string) error {
	return k.setLifecycle(ctx, registryv1.Lifecycle_LIFECYCLE_DRAINING, reason)
}

// Serve marks the instance SERVING again (after STARTING or a Drain).
func (k *Keeper) Serve(ctx context.Context) error {
	return k.setLifecycle(ctx, registryv1.Lifecycle_LIFECYCLE_SERVING, "")
}

func (k *Keeper) setLifecycle(ctx context.Context, lc registryv1.Lifecycle, reason string) error {
	k.mu.Lock()
	if k.mu.closed {
		k.mu.Unlock()
		return ErrClosed
	}
	k.mu.inst.Lifecycle, k.mu.inst.LifecycleReason = lc, reason
	service, id := k.mu.inst.Service, k.mu.inst.Id
	k.mu.Unlock()
	err := k.backend.SetLifecycle(ctx, service, id, lc, reason)
	if errors.Is(err, record.ErrNotFound) {
		// Between a lost lease and the next registration: that
		// registration applies it.
		k.mu.Lock()
		k.mu.pending = true
		k.mu.Unlock()
		// A registration may have landed since the write was refused,
		// before pending was set: apply it now if so (if the record is
		// still gone, it stays pending).
		if k.Registered() {
			k.applyPending(ctx)
		}
		return nil
	}
	return err
}

// Close drains the instance, waits until every live subscriber applied
// the drain (a DrainWaiter backend) or the drain grace period passes,
// whichever is first (or until ctx ends), stops renewing, deletes the record and revokes the lease. It is
// idempotent; later calls return the first call's result.
func (k *Keeper) Close(ctx context.Context) error {
	k.closeOnce.Do(func() { k.closeErr = k.close(ctx) })
	return k.closeErr
}

func (k *Keeper) close(ctx context.Context) error {
	drained := true
	if err := k.Drain(ctx, "shutting down"); err != nil {
		drained = false
		k.log.Warn("drain before deregister failed", "err", err)
	}
	k.mu.Lock()
	k.mu.closed = true
	k.mu.Unlock()
	if drained {
		k.waitDrained(ctx)
	}
	k.cancel()
	<-k.done
	st := k.Status()
	// A fresh context if the caller's is spent: deleting is what keeps a
	// closed instance from lingering a whole TTL.
	dctx := ctx
	if ctx.Err() != nil {
		var cancel context.CancelFunc
		dctx, cancel = context.WithTimeout(context.Background(), k.cfg.TTL)
		defer cancel()
	}
	o := k.owner(st.LeaseID)
	if err := k.backend.Deregister(dctx, o); err != nil {
		return fmt.Errorf("deregister %s/%s (its lease expires within %s anyway): %w", o.Service, o.ID, k.cfg.TTL, err)
	}
	k.setStatus(func(s *Status) { s.Registered, s.Closed = false, true })
	k.log.Info("deregistered", "lease", fmt.Sprintf("%x", st.LeaseID))
	return nil
}

// waitDrained waits, at most the drain grace, for the subscribers to see
// the drain: until the backend says all of them applied it, or the whole
// grace when it cannot say.
func (k *Keeper) waitDrained(ctx context.Context) {
	gctx, cancel := context.WithTimeout(ctx, k.cfg.DrainGrace)
	defer cancel()
	if dw, ok := k.backend.(DrainWaiter); ok {
		k.mu.Lock()
		service, id := k.mu.inst.Service, k.mu.inst.Id
		k.mu.Unlock()
		err := dw.WaitDrained(gctx, service, id)
		if err == nil {
			k.log.Info("every live subscriber applied the drain")
			return
		}
		if gctx.Err() != nil {
			// The grace (or the caller) ended the wait: what the grace is for.
			k.log.Info("drain grace ended before every subscriber was known to have applied the drain", "err", err)
			return
		}
		k.log.Warn("cannot tell whether every subscriber applied the drain; waiting the rest of the grace", "err", err)
	}
	<-gctx.Done()
}
