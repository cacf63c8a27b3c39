// Package store is the registry's records in etcd: register an instance under
// a lease, update it with compare-and-swap, delete it, and read it back at one
// revision. Both regnode and lease/ write through it, so the rules (a
// duplicate id alive under another owner is refused, concurrent writers to a
// key never lose an update, junk is skipped and reported) hold for every
// writer.
//
// Files: store.go holds Config, its LeaseSource, Committer and Renewer, and
// Store; errors.go the sentinels; register.go RegisterAs and the lease it
// takes; keepalive.go KeepAliveAs; update.go Update, UpdateIf, UpdateFrom
// and SetLifecycle; owner_lifecycle.go SetLifecycleAs; deregister.go
// Deregister and DeregisterAs; read.go Get, List and the reads they share;
// page.go ListPage; state.go the saved state that outlives a lease;
// leasebackend.go the lease.Backend on a Store.
package store

import (
	"context"
	"log/slog"
	"time"

	pb "go.etcd.io/etcd/api/v3/etcdserverpb"
	clientv3 "go.etcd.io/etcd/client/v3"

	"github.com/regcluster/registry/internal/etcdread"
	"github.com/regcluster/registry/record"
)

// Config configures a Store.
type Config struct {
	// Client is the etcd client; the Store does not close it.
	Client *clientv3.Client
	// Prefix is the key prefix (default record.DefaultPrefix).
	Prefix string
	// PageSize is the keys of List's first range read, and the least of
	// each later one (default 1000; later reads grow by the records'
	// size, see etcdread.Range).
	PageSize int64
	// Logger receives junk-record reports (default slog.Default()).
	Logger *slog.Logger
	// OnJunk, if set, is called once for every junk record a read skips.
	OnJunk func(key string, err error)
	// Now is the wall clock used for registered_at (default time.Now).
	Now func() time.Time
	// Leases, if set, is where Register takes its leases: granted ahead
	// and renewed at handover (regnode's pool). Without it each Register
	// grants its own.
	Leases LeaseSource
	// Commit, if set, group-commits Register's write with concurrent
	// registrations' (regnode's --group-commit), each keeping its own
	// compares and outcome. Without it each Register sends its own Txn.
	Commit Committer
	// Renew, if set, carries KeepAliveAs's renewals (regnode's: on one
	// shared LeaseKeepAlive stream). Without it each renewal opens a
	// stream of its own (clientv3's KeepAliveOnce).
	Renew Renewer
}

// LeaseSource hands Register its leases, granted ahead. Take returns a
// lease of ttl whose remaining TTL is its full TTL; Give takes back a lease
// Take returned that no key was ever attached to.
type LeaseSource interface {
	Take(ctx context.Context, ttl time.Duration) (clientv3.LeaseID, error)
	Give(ttl time.Duration, id clientv3.LeaseID)
}

// Committer commits Register's Txn, alone or within one etcd Txn with
// concurrent ones, and returns the branch it took, that branch's responses
// and the revision of the etcd Txn that carried it. An error means the Txn
// failed or may not have landed, as a Txn's error would.
type Committer interface {
	Commit(ctx context.Context, cmps []clientv3.Cmp, then, els []clientv3.Op) (succeeded bool, responses []*pb.ResponseOp, revision int64, err error)
}

// Renewer renews a lease once and returns its remaining TTL in seconds: 0
// or less, or an error wrapping rpctypes.ErrLeaseNotFound, when etcd no
// longer has the lease.
type Renewer interface {
	Renew(ctx context.Context, id int64) (ttl int64, err error)
}

// Store reads and writes instance records. It is safe for concurrent use.
type Store struct {
	cli    *clientv3.Client
	keys   record.Keys
	page   int64
	log    *slog.Logger
	onJunk func(string, error)
	now    func() time.Time
	leases LeaseSource
	commit Committer
	renew  Renewer
}

// New returns a Store; it fails only if cfg does not Validate.
func New(cfg Config) (*Store, error) {
	if err := cfg.Validate(); err != nil {
		return nil, err
	}
	cfg = cfg.withDefaults()
	return &Store{cli: cfg.Client, keys: record.NewKeys(cfg.Prefix), page: cfg.PageSize,
		log: cfg.Logger, onJunk: cfg.OnJunk, now: cfg.Now,
		leases: cfg.Leases, commit: cfg.Commit, renew: cfg.Renew}, nil
}

// Keys is the key layout the Store writes.
func (s *Store) Keys() record.Keys { return s.keys }

// Client is the etcd client the Store uses.
func (s *Store) Client() *clientv3.Client { return s.cli }

func (s *Store) junk(key string, err error) { s.decoder().Junk(key, err) }

// decoder is the Store's reader of records: it logs and reports junk.
func (s *Store) decoder() etcdread.Decoder {
	return etcdread.Decoder{Keys: s.keys, Log: s.log, OnJunk: s.onJunk}
}
