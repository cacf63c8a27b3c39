// Package leasepool takes lease grants off the registration path: a Pool
// keeps etcd leases granted ahead, per TTL, alive until a registration
// takes one, and a Renewer renews leases on demand over one long-lived
// LeaseKeepAlive stream (the Pool's idle leases, and every renewal a
// registry client asks for).
//
// A lease handed over by Take has just been renewed or granted (within
// Fresh, a tenth of its TTL at most one second), so its remaining TTL is
// about its full TTL at handover: a record put under it expires about one
// TTL after its registration or its last renewal, never later. Leases in the
// pool belong to nobody: Close revokes them, and after a crash they expire
// on their own within their TTL.
package leasepool

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"sync"
	"sync/atomic"
	"time"

	"go.etcd.io/etcd/api/v3/v3rpc/rpctypes"
	clientv3 "go.etcd.io/etcd/client/v3"

	"github.com/regcluster/registry/internal/configerr"
)

// Config configures a Pool.
type Config struct {
	// Client grants and revokes the leases (required; not closed by the Pool).
	Client *clientv3.Client
	// Renewer keeps idle leases alive and refreshes a lease at handover
	// (required; not closed by the Pool).
	Renewer *Renewer
	// Size is how many idle leases are kept ready per TTL (default 64).
	Size int
	// TTLs bounds how many distinct TTLs get a pool (default 4): a Take
	// of another TTL is granted on the spot.
	TTLs int
	// Grants bounds the grants one refill runs at once (default 16).
	Grants int
	// Tick is how often idle leases are looked at for renewal and the
	// pool for refill (default 250ms; an idle lease is renewed once a
	// third of its TTL has passed since its last renewal).
	Tick time.Duration
	// Logger (default slog.Default()).
	Logger *slog.Logger
}

// DefaultConfig is a Config with every default but the required fields.
func DefaultConfig() Config {
	return Config{Size: 64, TTLs: 4, Grants: 16, Tick: 250 * time.Millisecond}
}

// withDefaults is c with its zero fields set to DefaultConfig's: the one
// place defaults are filled, for Validate and New.
func (c Config) withDefaults() Config {
	d := DefaultConfig()
	if c.Size == 0 {
		c.Size = d.Size
	}
	if c.TTLs == 0 {
		c.TTLs = d.TTLs
	}
	if c.Grants == 0 {
		c.Grants = d.Grants
	}
	if c.Tick == 0 {
		c.Tick = d.Tick
	}
	if c.Logger == nil {
		c.Logger = slog.Default()
	}
	return c
}

// Validate reports a missing required field or a negative bound, with
// the defaults filled, as a *configerr.Error wrapping ErrInvalidConfig.
func (c Config) Validate() error {
	c = c.withDefaults()
	bad := func(field string, v any) error {
		return configerr.New(ErrInvalidConfig, "leasepool", field, v, "must be >= 0 (0: the default)")
	}
	switch {
	case c.Client == nil:
		return configerr.Required(ErrInvalidConfig, "leasepool", "Client")
	case c.Renewer == nil:
		return configerr.Required(ErrInvalidConfig, "leasepool", "Renewer")
	case c.Size < 0:
		return bad("Size", c.Size)
	case c.TTLs < 0:
		return bad("TTLs", c.TTLs)
	case c.Grants < 0:
		return bad("Grants", c.Grants)
	case c.Tick < 0:
		return bad("Tick", c.Tick)
	}
	return nil
}

// Stats counts what a Pool did.
type Stats struct {
	// Hits are Takes served from the pool, Misses those granted on the spot.
	Hits, Misses int64
	// Granted counts leases the pool granted ahead; Revoked, those Close
	// revoked; Expired, idle leases dropped because etcd no longer had
	// them or their renewal was overdue.
	Granted, Revoked, Expired int64
}

// Pool hands out leases granted ahead. Safe for concurrent use.
type Pool struct {
	cfg Config
	log *slog.Logger

	ctx    context.Context
	cancel context.CancelFunc
	wake   chan struct{}
	wg     sync.WaitGroup

	mu      sync.Mutex
	buckets map[int64]*bucket // by TTL in seconds
	closed  bool

	hits, misses, granted, revoked, expired atomic.Int64
}

type bucket struct {
	ttl      int64
	idle     []idle // Take takes the last (the latest granted or given back)
	granting int
}

type idle struct {
	id      clientv3.LeaseID
	renewed time.Time // when its remaining TTL was last the full TTL
}

// New starts a Pool; Close stops it.
func New(cfg Config) (*Pool, error) {
	if err := cfg.Validate(); err != nil {
		return nil, err
	}
	cfg = cfg.withDefaults()
	ctx, cancel := context.WithCancel(context.Background())
	p := &Pool{cfg: cfg, log: cfg.Logger, ctx: ctx, cancel: cancel, wake: make(chan struct{}, 1),
		buckets: map[int64]*bucket{}}
	p.wg.Add(1)
	go p.run()
	return p, nil
}

// Stats returns the counts so far.
func (p *Pool) Stats() Stats {
	return Stats{Hits: p.hits.Load(), Misses: p.misses.Load(), Granted: p.granted.Load(),
		Revoked: p.revoked.Load(), Expired: p.expired.Load()}
}

// Idle is how many leases of ttl are ready.
func (p *Pool) Idle(ttl time.Duration) int {
	p.mu.Lock()
	defer p.mu.Unlock()
	if b := p.buckets[int64(ttl/time.Second)]; b != nil {
		return len(b.idle)
	}
	return 0
}

// IdleTotal is how many leases are ready, of every TTL.
func (p *Pool) IdleTotal() int {
	p.mu.Lock()
	defer p.mu.Unlock()
	k := 0
	for _, b := range p.buckets {
		k += len(b.idle)
	}
	return k
}

// Take returns a lease of ttl (whole seconds) whose remaining TTL is its
// full TTL, give or take Fresh: one from the pool, renewed now unless
// it was granted or renewed less than Fresh(ttl) ago, or, when none is
// ready, one granted on the spot. It never hands over a lease with less
// than ttl - Fresh(ttl) left, so a record under it expires at most Fresh
// earlier than one TTL after its registration, and never later. The lease
// is the caller's: the pool forgets it.
func (p *Pool) Take(ctx context.Context, ttl time.Duration) (clientv3.LeaseID, error) {
	sec := int64(ttl / time.Second)
	for {
		l, ok := p.pop(sec)
		if !ok {
			break
		}
		if time.Since(l.renewed) < Fresh(ttl) {
			// Granted a moment ago (the pool refilling under load):
			// renewing would buy almost nothing, at a round trip each.
			p.hits.Add(1)
			return l.id, nil
		}
		if _, err := p.cfg.Renewer.Renew(ctx, int64(l.id)); err != nil {
			if errors.Is(err, ErrNotFound) {
				p.expired.Add(1)
				continue // lapsed in the pool: take the next
			}
			// The stream failed, the lease is likely fine: keep it for
			// later and grant this one directly.
			p.push(sec, l)
			break
		}
		p.hits.Add(1)
		return l.id, nil
	}
	p.misses.Add(1)
	resp, err := p.cfg.Client.Grant(ctx, sec)
	if err != nil {
		return 0, fmt.Errorf("grant a %ds lease: %w", sec, err)
	}
	return resp.ID, nil
}

// Fresh is how recently a pooled lease of ttl must have been granted or
// renewed to be handed over without renewing it: a tenth of ttl, at most
// one second.
func Fresh(ttl time.Duration) time.Duration { return min(ttl/10, time.Second) }

// Give returns a lease Take handed out that was never attached to a key
// (a registration refused before writing); it must not be used again by
// the caller. A lease of a TTL without a pool, or beyond the pool's size,
// is revoked.
func (p *Pool) Give(ttl time.Duration, id clientv3.LeaseID) {
	sec := int64(ttl / time.Second)
	p.mu.Lock()
	b := p.buckets[sec]
	if !p.closed && b != nil && len(b.idle) < p.cfg.Size {
		// When it was last renewed is the caller's to know: counted as
		// due, it is renewed on the next tick and at its next handover.
		full := time.Duration(sec) * time.Second
		b.idle = append(b.idle, idle{id: id, renewed: time.Now().Add(-full / 3)})
		p.mu.Unlock()
		return
	}
	p.mu.Unlock()
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	p.revoke(ctx, id)
}

// pop takes the last idle lease of sec, making the bucket
// if there is room for one, and asks for a refill.
func (p *Pool) pop(sec int64) (idle, bool) {
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.closed {
		return idle{}, false
	}
	b := p.buckets[sec]
	if b == nil {
		if len(p.buckets) >= p.cfg.TTLs {
			return idle{}, false
		}
		b = &bucket{ttl: sec}
		p.buckets[sec] = b
	}
	p.signal()
	if len(b.idle) == 0 {
		return idle{}, false
	}
	l := b.idle[len(b.idle)-1]
	b.idle = b.idle[:len(b.idle)-1]
	return l, true
}

// push puts back a lease pop took and could not renew (taken last next
// time), or revokes it if the pool closed meanwhile.
func (p *Pool) push(sec int64, l idle) {
	p.mu.Lock()
	if b := p.buckets[sec]; b != nil && !p.closed {
		b.idle = append([]idle{l}, b.idle...)
		p.mu.Unlock()
		return
	}
	p.mu.Unlock()
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	p.revoke(ctx, l.id)
}

func (p *Pool) signal() {
	select {
	case p.wake <- struct{}{}:
	default:
	}
}

// Close stops renewing and refilling, and revokes every idle lease (ctx
// bounds the revokes; a lease not revoked expires within its TTL). Leases
// handed out are not touched. After Close, Take grants every lease on the
// spot. Idempotent.
func (p *Pool) Close(ctx context.Context) error {
	p.cancel()
	p.wg.Wait()
	p.mu.Lock()
	var ids []clientv3.LeaseID
	for _, b := range p.buckets {
		for _, l := range b.idle {
			ids = append(ids, l.id)
		}
		b.idle = nil
	}
	p.closed = true
	p.mu.Unlock()
	var wg sync.WaitGroup
	errs := make([]error, len(ids))
	for i, id := range ids {
		wg.Add(1)
		go func() {
			defer wg.Done()
			errs[i] = p.revoke(ctx, id)
		}()
	}
	wg.Wait()
	return errors.Join(errs...)
}

func (p *Pool) revoke(ctx context.Context, id clientv3.LeaseID) error {
	if _, err := p.cfg.Client.Revoke(ctx, id); err != nil && !errors.Is(err, rpctypes.ErrLeaseNotFound) {
		return fmt.Errorf("revoke idle lease %x: %w", int64(id), err)
	}
	p.revoked.Add(1)
	return nil
}

// run renews idle leases a third of a TTL after their last renewal and
// refills every bucket up to Size, on every tick and after every Take.
func (p *Pool) run() {
	defer p.wg.Done()
	t := time.NewTicker(p.cfg.Tick)
	defer t.Stop()
	for {
		select {
		case <-p.ctx.Done():
			return
		case <-t.C:
		case <-p.wake:
		}
		p.maintain()
	}
}

func (p *Pool) maintain() {
	var (
		renew []struct {
			sec int64
			l   idle
		}
		grants []int64
		now    = time.Now()
	)
	p.mu.Lock()
	for sec, b := range p.buckets {
		full := time.Duration(sec) * time.Second
		kept := b.idle[:0]
		for _, l := range b.idle {
			switch age := now.Sub(l.renewed); {
			case age >= full:
				p.expired.Add(1) // may have lapsed: never hand it over; it expires on its own
				continue
			case age >= full/3:
				renew = append(renew, struct {
					sec int64
					l   idle
				}{sec, l})
			}
			kept = append(kept, l)
		}
		b.idle = kept
		for range p.cfg.Size - len(b.idle) - b.granting {
			grants = append(grants, sec)
			b.granting++
		}
	}
	p.mu.Unlock()
	if len(renew) == 0 && len(grants) == 0 {
		return
	}
	var wg sync.WaitGroup
	for _, r := range renew {
		wg.Add(1)
		go func() {
			defer wg.Done()
			_, err := p.cfg.Renewer.Renew(p.ctx, int64(r.l.id))
			p.mu.Lock()
			defer p.mu.Unlock()
			b := p.buckets[r.sec]
			for i := range b.idle {
				if b.idle[i].id != r.l.id {
					continue
				}
				switch {
				case err == nil:
					b.idle[i].renewed = time.Now()
				case errors.Is(err, ErrNotFound):
					b.idle = append(b.idle[:i], b.idle[i+1:]...)
					p.expired.Add(1)
				}
				return // else: tried again next tick, dropped once overdue
			}
		}()
	}
	sem := make(chan struct{}, p.cfg.Grants)
	for _, sec := range grants {
		wg.Add(1)
		go func() {
			defer wg.Done()
			var (
				resp *clientv3.LeaseGrantResponse
				err  = p.ctx.Err()
			)
			if err == nil {
				select {
				case sem <- struct{}{}:
					at := time.Now() // its TTL counts from before the grant was asked
					gctx, cancel := context.WithTimeout(p.ctx, 5*time.Second)
					resp, err = p.cfg.Client.Grant(gctx, sec)
					cancel()
					<-sem
					if err == nil {
						p.mu.Lock()
						b := p.buckets[sec]
						b.granting--
						b.idle = append(b.idle, idle{id: resp.ID, renewed: at})
						p.mu.Unlock()
						p.granted.Add(1)
						return
					}
				case <-p.ctx.Done():
					err = p.ctx.Err()
				}
			}
			p.mu.Lock()
			p.buckets[sec].granting--
			p.mu.Unlock()
			if p.ctx.Err() == nil {
				p.log.Warn("lease pool: grant ahead failed", "ttl_s", sec, "err", err)
			}
		}()
	}
	wg.Wait()
}
