// Package embedded runs one etcd member inside the current process, the way
// regnode does by default, and tells when it is ready to serve.
package embedded

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"net/url"
	"strings"
	"sync/atomic"
	"time"

	"go.etcd.io/etcd/server/v3/embed"

	"github.com/regcluster/registry/internal/zapslog"
)

// Config describes the member. Zero fields take DefaultConfig's values.
type Config struct {
	// Name is the member name (default "default").
	Name string
	// Dir holds the member's data (default "./regnode.data").
	Dir string
	// ListenClientURLs and AdvertiseClientURLs are the client endpoints
	// (default http://127.0.0.1:2379).
	ListenClientURLs, AdvertiseClientURLs []string
	// ListenPeerURLs and AdvertisePeerURLs are the peer endpoints
	// (default http://127.0.0.1:2380).
	ListenPeerURLs, AdvertisePeerURLs []string
	// InitialCluster is name=peerURL,... (default: this member alone).
	InitialCluster string
	// ClusterState is "new" or "existing" (default "new").
	ClusterState string
	// Token is the initial cluster token (default "regnode").
	Token string
	// LogLevel is etcd's own log level (default "warn").
	LogLevel string
	// UnsafeNoFsync skips fsync: for tests only, never for data you keep.
	UnsafeNoFsync bool
	// ReadyTimeout bounds the wait for the member to join (default 60s).
	ReadyTimeout time.Duration
	// ProgressNotifyInterval is how often idle watchers hear progress
	// (default 5s).
	ProgressNotifyInterval time.Duration
	// Logger receives etcd's own logs at LogLevel and above (default:
	// etcd's own zap logger on stderr).
	Logger *slog.Logger
}

// Member is a running embedded etcd member.
type Member struct {
	*embed.Etcd
	closing *atomic.Bool
}

// Close stops the member, quietly: the errors etcd logs about its own
// listeners closing are dropped.
func (m *Member) Close() {
	m.closing.Store(true)
	m.Etcd.Close()
}

func (c *Config) defaults() {
	if c.Name == "" {
		c.Name = "default"
	}
	if c.Dir == "" {
		c.Dir = "regnode.data"
	}
	if len(c.ListenClientURLs) == 0 {
		c.ListenClientURLs = []string{"http://127.0.0.1:2379"}
	}
	if len(c.AdvertiseClientURLs) == 0 {
		c.AdvertiseClientURLs = c.ListenClientURLs
	}
	if len(c.ListenPeerURLs) == 0 {
		c.ListenPeerURLs = []string{"http://127.0.0.1:2380"}
	}
	if len(c.AdvertisePeerURLs) == 0 {
		c.AdvertisePeerURLs = c.ListenPeerURLs
	}
	if c.InitialCluster == "" {
		parts := make([]string, len(c.AdvertisePeerURLs))
		for i, u := range c.AdvertisePeerURLs {
			parts[i] = c.Name + "=" + u
		}
		c.InitialCluster = strings.Join(parts, ",")
	}
	if c.ClusterState == "" {
		c.ClusterState = embed.ClusterStateFlagNew
	}
	if c.Token == "" {
		c.Token = "regnode"
	}
	if c.LogLevel == "" {
		c.LogLevel = "warn"
	}
	if c.ReadyTimeout == 0 {
		c.ReadyTimeout = 60 * time.Second
	}
	if c.ProgressNotifyInterval == 0 {
		c.ProgressNotifyInterval = 5 * time.Second
	}
}

func parseURLs(field string, ss []string) ([]url.URL, error) {
	out := make([]url.URL, 0, len(ss))
	for _, s := range ss {
		u, err := url.Parse(strings.TrimSpace(s))
		if err != nil || u.Scheme == "" || u.Host == "" {
			return nil, fmt.Errorf("%s: %q is not a URL like http://127.0.0.1:2379", field, s)
		}
		out = append(out, *u)
	}
	return out, nil
}

// Start starts the member and waits until it serves clients, ctx is done,
// or ReadyTimeout passes. The caller closes the returned member.
func Start(ctx context.Context, c Config) (*Member, error) {
	c.defaults()
	cfg := embed.NewConfig()
	cfg.Name = c.Name
	cfg.Dir = c.Dir
	var err error
	if cfg.ListenClientUrls, err = parseURLs("listen-client-urls", c.ListenClientURLs); err != nil {
		return nil, err
	}
	if cfg.AdvertiseClientUrls, err = parseURLs("advertise-client-urls", c.AdvertiseClientURLs); err != nil {
		return nil, err
	}
	if cfg.ListenPeerUrls, err = parseURLs("listen-peer-urls", c.ListenPeerURLs); err != nil {
		return nil, err
	}
	if cfg.AdvertisePeerUrls, err = parseURLs("initial-advertise-peer-urls", c.AdvertisePeerURLs); err != nil {
		return nil, err
	}
	cfg.InitialCluster = c.InitialCluster
	cfg.ClusterState = c.ClusterState
	cfg.InitialClusterToken = c.Token
	cfg.LogLevel = c.LogLevel
	cfg.UnsafeNoFsync = c.UnsafeNoFsync
	cfg.WatchProgressNotifyInterval = c.ProgressNotifyInterval
	// One process, many members in tests: never share the default metrics
	// endpoints or the process-wide zap globals.
	cfg.Metrics = "basic"
	closing := &atomic.Bool{}
	if c.Logger != nil {
		cfg.ZapLoggerBuilder = embed.NewZapLoggerBuilder(zapslog.New(c.Logger, c.LogLevel, closing))
	}
	if err := cfg.Validate(); err != nil {
		return nil, fmt.Errorf("embedded etcd %s: %w", c.Name, err)
	}
	e, err := embed.StartEtcd(cfg)
	if err != nil {
		return nil, fmt.Errorf("start embedded etcd %s in %s: %w", c.Name, c.Dir, err)
	}
	t := time.NewTimer(c.ReadyTimeout)
	defer t.Stop()
	select {
	case <-e.Server.ReadyNotify():
		return &Member{Etcd: e, closing: closing}, nil
	case err := <-e.Err():
		e.Close()
		return nil, fmt.Errorf("embedded etcd %s failed while starting: %w", c.Name, err)
	case <-ctx.Done():
		e.Close()
		return nil, fmt.Errorf("embedded etcd %s: %w", c.Name, ctx.Err())
	case <-t.C:
		e.Server.Stop()
		e.Close()
		return nil, fmt.Errorf("embedded etcd %s: %w after %s (are the other members of %q up?)",
			c.Name, errors.New("not ready"), c.ReadyTimeout, c.InitialCluster)
	}
}
