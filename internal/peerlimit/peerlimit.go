// Package peerlimit holds one caller's share of a regnode: per key,
// token-bucket rate limits on writes (Register, Deregister, Drain,
// Undrain) and on lease renewals, a cap on concurrent streams (Watch and
// KeepAlive), a cap on the registrations it holds (holds.go) and a bound
// on its writes in flight, past which they wait their turn (inflight.go).
// One key over its limits is refused (or, in flight, made to wait); every
// other key keeps its own buckets and counts, so a flood from one key
// starves no one else. The key is any
// string the caller chooses: the peer's IP address (Peer) when auth is
// off, a token's name when it is on.
package peerlimit

import (
	"context"
	"errors"
	"fmt"
	"math"
	"net"
	"sync"
	"time"

	"golang.org/x/time/rate"
	"google.golang.org/grpc/peer"

	"github.com/regcluster/registry/internal/configerr"
)

// ErrLimited is wrapped by every *Error: a caller over one of its limits.
var ErrLimited = errors.New("over a per-peer limit")

// Names of the limits, as Error.Limit and the metric's label say them.
const (
	WriteRate     = "write_rate"
	KeepAliveRate = "keepalive_rate"
	Streams       = "streams"
	Registrations = "registrations"
)

// Config is the limits of one peer. DefaultConfig is generous enough
// that a whole test cluster on one host (1,000 instances registering at
// once from 127.0.0.1, each renewing every TTL/3) is never limited.
type Config struct {
	// WriteRate is the sustained Register, Deregister, Drain and Undrain
	// calls per second per peer (default 500).
	WriteRate float64
	// WriteBurst is how many writes a peer may make at once (default 2000).
	WriteBurst int
	// KeepAliveRate is the sustained lease renewals per second per peer
	// (default 2000).
	KeepAliveRate float64
	// KeepAliveBurst is how many renewals a peer may make at once
	// (default 4000).
	KeepAliveBurst int
	// MaxStreams caps the concurrent Watch, Subscribe, KeepAlive and xDS streams of one
	// peer (default 4096).
	MaxStreams int
	// MaxRegistrations caps the registrations one key holds on this
	// regnode: granted by it and not yet ended (default 1500: a test
	// cluster of 1,000 instances on one host, plus half again for
	// instances restarted under new ids while their old leases run out).
	MaxRegistrations int
	// MaxWritesInFlight is how many writes of one key run at once; more
	// wait their turn in the regnode (default 16: at etcd latencies up to
	// 30ms that still lets a key write faster than WriteRate).
	MaxWritesInFlight int
}

// DefaultConfig is the limits of a regnode with no flags.
func DefaultConfig() Config {
	return Config{WriteRate: 500, WriteBurst: 2000, KeepAliveRate: 2000, KeepAliveBurst: 4000, MaxStreams: 4096,
		MaxRegistrations: 1500, MaxWritesInFlight: 16}
}

// Unlimited limits nothing: for benchmarks of the registry's own cost
// (thousands of registrations and subscribers from one host), never for
// a regnode others can reach.
func Unlimited() Config {
	return Config{WriteRate: math.Inf(1), WriteBurst: 1, KeepAliveRate: math.Inf(1), KeepAliveBurst: 1, MaxStreams: math.MaxInt,
		MaxRegistrations: math.MaxInt, MaxWritesInFlight: math.MaxInt}
}

// ErrInvalidConfig is wrapped by every error of Config.Validate, and so of
// New (see package configerr).
var ErrInvalidConfig = errors.New("peerlimit: invalid config")

// Validate reports the first limit that cannot work, naming its Config
// field, as a *configerr.Error wrapping ErrInvalidConfig. No field has a
// zero default: the zero Config limits everything to nothing and is
// refused (node.Config takes a zero Limits as DefaultConfig()).
func (c Config) Validate() error {
	bad := func(field string, v any, rule string) error {
		return configerr.New(ErrInvalidConfig, "peerlimit", field, v, rule)
	}
	switch {
	case !(c.WriteRate > 0):
		return bad("WriteRate", c.WriteRate, "must be > 0")
	case c.WriteBurst < 1:
		return bad("WriteBurst", c.WriteBurst, "must be at least 1")
	case !(c.KeepAliveRate > 0):
		return bad("KeepAliveRate", c.KeepAliveRate, "must be > 0")
	case c.KeepAliveBurst < 1:
		return bad("KeepAliveBurst", c.KeepAliveBurst, "must be at least 1")
	case c.MaxStreams < 1:
		return bad("MaxStreams", c.MaxStreams, "must be at least 1")
	case c.MaxRegistrations < 1:
		return bad("MaxRegistrations", c.MaxRegistrations, "must be at least 1")
	case c.MaxWritesInFlight < 1:
		return bad("MaxWritesInFlight", c.MaxWritesInFlight, "must be at least 1")
	}
	return nil
}

// Error is a refusal: which limit, for which peer, and when a retry can
// succeed (0 when it depends on another call ending: a stream slot).
type Error struct {
	Limit      string
	Peer       string
	Detail     string
	RetryAfter time.Duration
}

func (e *Error) Error() string {
	msg := fmt.Sprintf("peer %s is over its %s limit (%s)", e.Peer, e.Limit, e.Detail)
	if e.RetryAfter > 0 {
		msg += fmt.Sprintf("; retry in %s", e.RetryAfter.Round(time.Millisecond))
	}
	return msg
}

// Unwrap makes every Error match ErrLimited.
func (e *Error) Unwrap() error { return ErrLimited }

// sweepEvery is how many calls pass between sweeps of idle peers.
const sweepEvery = 4096

// Limiter keeps the buckets of every peer. It is safe for concurrent use.
type Limiter struct {
	cfg Config
	mu  struct {
		sync.Mutex
		peers map[string]*bucket
		calls int
		held  map[Instance]hold // the registrations this regnode granted and has not seen end
	}
}

type bucket struct {
	rate, renewals *rate.Limiter
	streams        int
	registrations  int  // held, plus reserved by Registers in flight
	writes         gate // in flight and waiting
}

// New returns a Limiter of cfg; it fails if cfg does not validate.
func New(cfg Config) (*Limiter, error) {
	if err := cfg.Validate(); err != nil {
		return nil, err
	}
	l := &Limiter{cfg: cfg}
	l.mu.peers = map[string]*bucket{}
	l.mu.held = map[Instance]hold{}
	return l, nil
}

// Config is the limits l enforces.
func (l *Limiter) Config() Config { return l.cfg }

// get returns p's bucket, making it on first use; l.mu is held. Every
// sweepEvery calls it forgets peers that are idle: no stream open and
// both buckets full, which is exactly the state of a new bucket, so
// forgetting them changes no decision and bounds the map. A peer holding
// registrations is not idle.
func (l *Limiter) get(p string) *bucket {
	l.mu.calls++
	if l.mu.calls%sweepEvery == 0 {
		now := time.Now()
		for k, b := range l.mu.peers {
			if b.streams == 0 && b.registrations == 0 && b.writes.running == 0 && len(b.writes.waiting) == 0 && b.rate.TokensAt(now) >= float64(l.cfg.WriteBurst) && b.renewals.TokensAt(now) >= float64(l.cfg.KeepAliveBurst) {
				delete(l.mu.peers, k)
			}
		}
	}
	b, ok := l.mu.peers[p]
	if !ok {
		b = &bucket{rate: rate.NewLimiter(rate.Limit(l.cfg.WriteRate), l.cfg.WriteBurst),
			renewals: rate.NewLimiter(rate.Limit(l.cfg.KeepAliveRate), l.cfg.KeepAliveBurst)}
		l.mu.peers[p] = b
	}
	return b
}

// Write takes one write from p's bucket, or returns an *Error saying when
// one will be there. A refused write takes nothing.
func (l *Limiter) Write(p string) error {
	l.mu.Lock()
	defer l.mu.Unlock()
	return take(l.get(p).rate, p, WriteRate, fmt.Sprintf("%g writes/s, burst %d", l.cfg.WriteRate, l.cfg.WriteBurst))
}

// KeepAlive takes one renewal from p's bucket, as Write does.
func (l *Limiter) KeepAlive(p string) error {
	l.mu.Lock()
	defer l.mu.Unlock()
	return take(l.get(p).renewals, p, KeepAliveRate, fmt.Sprintf("%g renewals/s, burst %d", l.cfg.KeepAliveRate, l.cfg.KeepAliveBurst))
}

func take(lim *rate.Limiter, p, name, detail string) error {
	now := time.Now()
	r := lim.ReserveN(now, 1)
	if d := r.DelayFrom(now); d > 0 {
		r.CancelAt(now)
		return &Error{Limit: name, Peer: p, Detail: detail, RetryAfter: d}
	}
	return nil
}

// OpenStream takes one of p's stream slots until release is called (once;
// later calls do nothing), or returns an *Error when all are taken.
func (l *Limiter) OpenStream(p string) (release func(), err error) {
	l.mu.Lock()
	defer l.mu.Unlock()
	b := l.get(p)
	if b.streams >= l.cfg.MaxStreams {
		return nil, &Error{Limit: Streams, Peer: p, Detail: fmt.Sprintf("%d concurrent Watch and KeepAlive streams; close one first", l.cfg.MaxStreams)}
	}
	b.streams++
	var once sync.Once
	return func() {
		once.Do(func() {
			l.mu.Lock()
			defer l.mu.Unlock()
			b.streams-- // b is still in the map: get never forgets a peer with a stream open
		})
	}, nil
}

// Peer is the address a call came from, as the limits key it: the IP of
// a TCP peer (every port of one host is one peer), the whole address
// otherwise (a unix socket), "unknown" if the call carries none.
func Peer(ctx context.Context) string {
	p, ok := peer.FromContext(ctx)
	if !ok || p.Addr == nil {
		return "unknown"
	}
	if host, _, err := net.SplitHostPort(p.Addr.String()); err == nil {
		return host
	}
	return p.Addr.String()
}

// Loopback reports whether the call came from this host: a loopback IP
// or a unix socket.
func Loopback(ctx context.Context) bool {
	p, ok := peer.FromContext(ctx)
	if !ok || p.Addr == nil {
		return false
	}
	if p.Addr.Network() == "unix" {
		return true
	}
	host, _, err := net.SplitHostPort(p.Addr.String())
	if err != nil {
		return false
	}
	ip := net.ParseIP(host)
	return ip != nil && ip.IsLoopback()
}
