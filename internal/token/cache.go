package token

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"sort"
	"strings"
	"sync"
	"time"

	"go.etcd.io/etcd/api/v3/v3rpc/rpctypes"
	clientv3 "go.etcd.io/etcd/client/v3"

	"github.com/regcluster/registry/internal/configerr"
)

// Config configures a Cache.
type Config struct {
	// Client is the etcd client the cache lists and watches with (required).
	Client *clientv3.Client
	// Prefix is the registry's key prefix (required): records live under
	// <Prefix>auth/tokens/.
	Prefix string
	// Logger (default slog.Default()).
	Logger *slog.Logger
	// OnJunk is called for a stored value that is not a Record (it grants
	// nothing); optional.
	OnJunk func(key string, err error)
	// Now is the clock expiry is judged by (default time.Now).
	Now func() time.Time
}

// DefaultConfig is a Cache of the default prefix; Client must be set.
func DefaultConfig() Config { return Config{Prefix: "/registry/v1/"} }

// withDefaults is c with its nil Logger and Now set: the one place
// defaults are filled, for NewCache. (Prefix has no zero default.)
func (c Config) withDefaults() Config {
	if c.Logger == nil {
		c.Logger = slog.Default()
	}
	if c.Now == nil {
		c.Now = time.Now
	}
	return c
}

// Validate reports a missing Client or a Prefix not starting with '/', as
// a *configerr.Error wrapping ErrInvalidConfig.
func (c Config) Validate() error {
	if c.Client == nil {
		return configerr.Required(ErrInvalidConfig, "token", "Client")
	}
	if !strings.HasPrefix(c.Prefix, "/") {
		return configerr.New(ErrInvalidConfig, "token", "Prefix", c.Prefix, "must start with '/'")
	}
	return nil
}

// Cache is this regnode's copy of every token record, kept by one etcd
// watch (list, then watch from the list's revision; list again when the
// watch is compacted or fails). A create or revoke on any regnode reaches
// it as one watch event, so it takes effect everywhere as fast as etcd
// delivers a watch (well under a second); expiry is judged at every
// check, so it needs no event at all. Check refuses every call until the
// first list is in (Ready). Safe for concurrent use.
type Cache struct {
	cfg   Config
	ready chan struct{}
	once  sync.Once

	mu      sync.RWMutex
	byHash  map[string]*Record
	byName  map[string]*Record
	rev     int64
	lastUse map[string]time.Time     // kept in memory only: never written by a call
	gone    map[string]chan struct{} // by hash: closed when that token leaves the cache
	moved   chan struct{}            // closed and replaced whenever rev moves
}

// NewCache returns a Cache of cfg; Run fills it.
func NewCache(cfg Config) (*Cache, error) {
	if err := cfg.Validate(); err != nil {
		return nil, err
	}
	cfg = cfg.withDefaults()
	return &Cache{cfg: cfg, ready: make(chan struct{}), byHash: map[string]*Record{},
		byName: map[string]*Record{}, lastUse: map[string]time.Time{}, gone: map[string]chan struct{}{}, moved: make(chan struct{})}, nil
}

// Ready is closed once the first list is in.
func (c *Cache) Ready() <-chan struct{} { return c.ready }

// Revision is the etcd revision the cache reflects.
func (c *Cache) Revision() int64 {
	c.mu.RLock()
	defer c.mu.RUnlock()
	return c.rev
}

// WaitRevision waits until the cache reflects etcd revision rev (or
// later), so that a token created or revoked at rev is judged so by this
// regnode once it returns; it fails only with ctx.
func (c *Cache) WaitRevision(ctx context.Context, rev int64) error {
	for {
		c.mu.RLock()
		at, moved := c.rev, c.moved
		c.mu.RUnlock()
		if at >= rev {
			return nil
		}
		select {
		case <-moved:
		case <-ctx.Done():
			return fmt.Errorf("token cache at revision %d, waiting for %d: %w", at, rev, ctx.Err())
		}
	}
}

// setRev moves the cache to rev; c.mu is held.
func (c *Cache) setRev(rev int64) {
	if rev > c.rev {
		c.rev = rev
		close(c.moved)
		c.moved = make(chan struct{})
	}
}

func (c *Cache) now() time.Time { return c.cfg.Now() }

func (c *Cache) lookup(hash string) *Record {
	c.mu.RLock()
	defer c.mu.RUnlock()
	return c.byHash[hash]
}

func (c *Cache) used(name string, at time.Time) {
	c.mu.Lock()
	defer c.mu.Unlock()
	if at.After(c.lastUse[name]) {
		c.lastUse[name] = at
	}
}

// Gone is closed once the token of r is no longer in the cache (revoked,
// or its record deleted or rewritten): closed already if it is not there
// now. Streams opened with r end on it.
func (c *Cache) Gone(r *Record) <-chan struct{} {
	c.mu.Lock()
	defer c.mu.Unlock()
	ch, ok := c.gone[r.Hash]
	if !ok {
		ch = make(chan struct{})
		if _, there := c.byHash[r.Hash]; !there {
			close(ch)
			return ch
		}
		c.gone[r.Hash] = ch
	}
	return ch
}

// forget closes the Gone channel of hash; c.mu is held.
func (c *Cache) forget(hash string) {
	if ch, ok := c.gone[hash]; ok {
		close(ch)
		delete(c.gone, hash)
	}
}

// Entry is a record with its last use on this regnode.
type Entry struct {
	Record
	LastUsed time.Time // zero: not since this regnode started
}

// List is every token record, by name, with its last use here.
func (c *Cache) List() []Entry {
	c.mu.RLock()
	defer c.mu.RUnlock()
	out := make([]Entry, 0, len(c.byName))
	for _, r := range c.byName {
		out = append(out, Entry{Record: *r, LastUsed: c.lastUse[r.Name]})
	}
	sort.Slice(out, func(i, j int) bool { return out[i].Name < out[j].Name })
	return out
}

// Run keeps the cache until ctx ends; it returns ctx's error.
func (c *Cache) Run(ctx context.Context) error {
	backoff := 50 * time.Millisecond
	for {
		err := c.listWatch(ctx)
		if ctx.Err() != nil {
			return ctx.Err()
		}
		c.cfg.Logger.Warn("token cache: etcd watch ended; listing again", "err", err, "retry_in", backoff)
		select {
		case <-ctx.Done():
			return ctx.Err()
		case <-time.After(backoff):
		}
		backoff = min(2*backoff, 2*time.Second)
	}
}

// listWatch lists every record, then applies the watch from there until
// it fails.
func (c *Cache) listWatch(ctx context.Context) error {
	pfx := tokensPrefix(c.cfg.Prefix)
	lctx, cancel := context.WithTimeout(ctx, 10*time.Second)
	resp, err := c.cfg.Client.Get(lctx, pfx, clientv3.WithPrefix())
	cancel()
	if err != nil {
		return fmt.Errorf("list %s: %w", pfx, err)
	}
	byName := make(map[string]*Record, len(resp.Kvs))
	for _, kv := range resp.Kvs {
		if r := c.decode(string(kv.Key), kv.Value); r != nil {
			byName[r.Name] = r
		}
	}
	c.replace(byName, resp.Header.Revision)
	c.once.Do(func() { close(c.ready) })

	wctx, stop := context.WithCancel(clientv3.WithRequireLeader(ctx))
	defer stop()
	for wr := range c.cfg.Client.Watch(wctx, pfx, clientv3.WithPrefix(), clientv3.WithRev(resp.Header.Revision+1)) {
		if err := wr.Err(); err != nil {
			if errors.Is(err, rpctypes.ErrCompacted) {
				return fmt.Errorf("watch %s compacted at %d: %w", pfx, wr.CompactRevision, err)
			}
			return fmt.Errorf("watch %s: %w", pfx, err)
		}
		c.mu.Lock()
		for _, ev := range wr.Events {
			name := strings.TrimPrefix(string(ev.Kv.Key), pfx)
			c.remove(name)
			if ev.Type == clientv3.EventTypePut {
				if r := c.decode(string(ev.Kv.Key), ev.Kv.Value); r != nil {
					c.byName[r.Name], c.byHash[r.Hash] = r, r
				}
			}
		}
		c.setRev(wr.Header.Revision)
		c.mu.Unlock()
	}
	return fmt.Errorf("watch %s closed", pfx)
}

// decode is the record stored at key, or nil (reported) if it is junk or
// not under its own name.
func (c *Cache) decode(key string, value []byte) *Record {
	r, err := Decode(value)
	if err == nil && key != Key(c.cfg.Prefix, r.Name) {
		err = fmt.Errorf("%w: record of %s stored at another name", ErrJunk, r.Name)
	}
	if err != nil {
		c.cfg.Logger.Warn("token cache: skipping a record that is not a token", "key", key, "err", err)
		if c.cfg.OnJunk != nil {
			c.cfg.OnJunk(key, err)
		}
		return nil
	}
	return r
}

func (c *Cache) replace(byName map[string]*Record, rev int64) {
	c.mu.Lock()
	defer c.mu.Unlock()
	c.byName, c.byHash = byName, make(map[string]*Record, len(byName))
	c.setRev(rev)
	for _, r := range byName {
		c.byHash[r.Hash] = r
	}
	for name := range c.lastUse {
		if _, ok := byName[name]; !ok {
			delete(c.lastUse, name)
		}
	}
	for hash := range c.gone {
		if _, ok := c.byHash[hash]; !ok {
			c.forget(hash)
		}
	}
}

// remove forgets the token named name; c.mu is held.
func (c *Cache) remove(name string) {
	if old, ok := c.byName[name]; ok {
		c.forget(old.Hash)
		delete(c.byHash, old.Hash)
		delete(c.byName, name)
		delete(c.lastUse, name)
	}
}
