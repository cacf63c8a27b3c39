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

	"go.etcd.io/etcd/client/pkg/v3/transport"
	"go.etcd.io/etcd/server/v3/embed"

	"github.com/regcluster/registry/internal/configerr"
	"github.com/regcluster/registry/internal/tlsfiles"
	"github.com/regcluster/registry/internal/zapslog"
)

// Config describes the member. A zero field takes the default its comment
// states (DefaultConfig has those that are not derived from others); a
// negative number is refused.
type Config struct {
	// Name is the member name ("": "default").
	Name string
	// Dir holds the member's data ("": "regnode.data", in the working
	// directory).
	Dir string
	// ListenClientURLs are the client endpoints (empty:
	// http://127.0.0.1:2379); AdvertiseClientURLs those told to the
	// cluster (empty: ListenClientURLs). Each must be a URL with a scheme
	// and a host.
	ListenClientURLs, AdvertiseClientURLs []string
	// ListenPeerURLs are the peer endpoints (empty:
	// http://127.0.0.1:2380); AdvertisePeerURLs those told to the
	// cluster (empty: ListenPeerURLs).
	ListenPeerURLs, AdvertisePeerURLs []string
	// InitialCluster is name=peerURL,... ("": this member alone, at its
	// AdvertisePeerURLs).
	InitialCluster string
	// ClusterState is "new" or "existing" ("": "new").
	ClusterState string
	// Token is the initial cluster token ("": "regnode"): it keeps
	// clusters started side by side from joining each other.
	Token string
	// LogLevel is etcd's own log level ("": "warn"; etcd refuses a
	// level it does not know).
	LogLevel string
	// UnsafeNoFsync skips fsync: for tests only, never for data you keep.
	UnsafeNoFsync bool
	// ReadyTimeout bounds the wait for the member to join (0: 60s,
	// long enough for the other members of a new cluster to start).
	ReadyTimeout time.Duration
	// ProgressNotifyInterval is how often idle watchers hear progress
	// (0: 5s, etcd's --experimental-watch-progress-notify-interval is
	// 10m; the registry's watchers want to hear sooner).
	ProgressNotifyInterval time.Duration
	// Logger receives etcd's own logs at LogLevel and above, and Start's
	// progress at info (nil: etcd's own zap logger on stderr; progress
	// is then not logged).
	Logger *slog.Logger
	// DataDir, if set, is Dir already locked by the caller (LockDataDir),
	// who then unlocks or discards it after the member closes. If nil,
	// Start locks Dir itself and the member's Close unlocks it.
	DataDir *DataDir
	// QuotaBackendBytes is etcd's space quota (--quota-backend-bytes; 0:
	// etcd's default of 2 GiB). Past it etcd raises the NOSPACE alarm and
	// refuses writes that add data, while reads and deletes go on.
	QuotaBackendBytes int64
	// BcryptCost is etcd's cost for hashing user passwords when auth is
	// on (--bcrypt-cost; 0: etcd's default, bcrypt.DefaultCost). Tests
	// use bcrypt.MinCost: under -race on a loaded machine one hash at the
	// default takes seconds, and every authentication pays one.
	BcryptCost int
	// ClientTLS is the TLS of the member's client port, needed by https
	// ListenClientURLs (regnode's --etcd-server-cert-file...; etcd's own
	// --cert-file... names are the registry API's). etcd re-reads the
	// files on every handshake, so a replaced certificate is served
	// without a restart.
	ClientTLS tlsfiles.Server
	// PeerTLS is the TLS between members, needed by https ListenPeerURLs
	// (etcd's --peer-cert-file, --peer-key-file, --peer-trusted-ca-file,
	// --peer-client-cert-auth). The certificate is also the one a member
	// presents when it dials its peers.
	PeerTLS tlsfiles.Server
}

// Member is a running embedded etcd member.
type Member struct {
	*embed.Etcd
	closing *atomic.Bool
	dir     *DataDir // unlocked by Close when Start locked it
}

// Close stops the member, quietly (the errors etcd logs about its own
// listeners closing are dropped), and releases its data directory if
// Start locked it.
func (m *Member) Close() {
	m.closing.Store(true)
	m.Etcd.Close()
	if m.dir != nil {
		m.dir.Unlock()
	}
}

// DefaultConfig is a Config with every default that does not depend on
// another field (AdvertiseClientURLs, AdvertisePeerURLs and
// InitialCluster follow the listen URLs and the name).
func DefaultConfig() Config {
	return Config{Name: "default", Dir: "regnode.data", ListenClientURLs: []string{"http://127.0.0.1:2379"},
		ListenPeerURLs: []string{"http://127.0.0.1:2380"}, ClusterState: embed.ClusterStateFlagNew, Token: "regnode",
		LogLevel: "warn", ReadyTimeout: 60 * time.Second, ProgressNotifyInterval: 5 * time.Second}
}

// withDefaults is c with its zero fields set to their defaults: the one
// place defaults are filled, for Validate, ValidateTLS and Start.
func (c Config) withDefaults() Config {
	d := DefaultConfig()
	if c.Name == "" {
		c.Name = d.Name
	}
	if c.Dir == "" {
		c.Dir = d.Dir
	}
	if len(c.ListenClientURLs) == 0 {
		c.ListenClientURLs = d.ListenClientURLs
	}
	if len(c.AdvertiseClientURLs) == 0 {
		c.AdvertiseClientURLs = c.ListenClientURLs
	}
	if len(c.ListenPeerURLs) == 0 {
		c.ListenPeerURLs = d.ListenPeerURLs
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
		c.ClusterState = d.ClusterState
	}
	if c.Token == "" {
		c.Token = d.Token
	}
	if c.LogLevel == "" {
		c.LogLevel = d.LogLevel
	}
	if c.ReadyTimeout == 0 {
		c.ReadyTimeout = d.ReadyTimeout
	}
	if c.ProgressNotifyInterval == 0 {
		c.ProgressNotifyInterval = d.ProgressNotifyInterval
	}
	return c
}

// Validate reports the first field that cannot work, with its defaults
// filled, as a *configerr.Error wrapping ErrInvalidConfig. It does not
// check TLS against the URLs: ValidateTLS does (Start checks both).
func (c Config) Validate() error {
	c = c.withDefaults()
	bad := func(field string, v any, rule string) error {
		return configerr.New(ErrInvalidConfig, "embedded", field, v, rule)
	}
	for _, f := range []struct {
		name string
		urls []string
	}{
		{"ListenClientURLs", c.ListenClientURLs}, {"AdvertiseClientURLs", c.AdvertiseClientURLs},
		{"ListenPeerURLs", c.ListenPeerURLs}, {"AdvertisePeerURLs", c.AdvertisePeerURLs},
	} {
		for _, u := range f.urls {
			if _, err := parseURLs(f.name, []string{u}); err != nil {
				return bad(f.name, u, "must be a URL like http://127.0.0.1:2379")
			}
		}
	}
	switch {
	case c.ClusterState != embed.ClusterStateFlagNew && c.ClusterState != embed.ClusterStateFlagExisting:
		return bad("ClusterState", c.ClusterState, `must be "new" or "existing"`)
	case c.ReadyTimeout < 0:
		return bad("ReadyTimeout", c.ReadyTimeout, "must be >= 0 (0: the default)")
	case c.ProgressNotifyInterval < 0:
		return bad("ProgressNotifyInterval", c.ProgressNotifyInterval, "must be >= 0 (0: the default)")
	case c.QuotaBackendBytes < 0:
		return bad("QuotaBackendBytes", c.QuotaBackendBytes, "must be >= 0 (0: etcd's default)")
	case c.BcryptCost < 0:
		return bad("BcryptCost", c.BcryptCost, "must be >= 0 (0: etcd's default)")
	}
	return nil
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

// ValidateTLS reports URLs and TLS settings that do not fit together: an
// https URL without a certificate, a certificate no URL serves, a client
// certificate demanded with no CA to check it against. Unset URLs count
// as their http defaults. Start checks it too.
func (c Config) ValidateTLS() error {
	c = c.withDefaults()
	client, err := parseURLs("listen-client-urls", c.ListenClientURLs)
	if err != nil {
		return err
	}
	peer, err := parseURLs("listen-peer-urls", c.ListenPeerURLs)
	if err != nil {
		return err
	}
	if err := schemesMatch("listen-client-urls", "etcd-server-", client, c.ClientTLS); err != nil {
		return err
	}
	return schemesMatch("listen-peer-urls", "peer-", peer, c.PeerTLS)
}

// schemesMatch refuses https URLs without a certificate, and a
// certificate no URL would serve (TLS asked for and silently not used).
func schemesMatch(field, flag string, urls []url.URL, t tlsfiles.Server) error {
	if err := t.Validate(flag); err != nil {
		return err
	}
	for _, u := range urls {
		switch {
		case u.Scheme == "https" && !t.Enabled():
			return fmt.Errorf("--%s %s is https: it needs --%scert-file and --%skey-file", field, u.String(), flag, flag)
		case u.Scheme == "http" && t.Enabled():
			return fmt.Errorf("--%s %s is plain http, but --%scert-file is set: use https://", field, u.String(), flag)
		}
	}
	return nil
}

func tlsInfo(t tlsfiles.Server) transport.TLSInfo {
	return transport.TLSInfo{CertFile: t.CertFile, KeyFile: t.KeyFile, TrustedCAFile: t.TrustedCAFile,
		ClientCertAuth: t.ClientCertAuth}
}

// Start starts the member and waits until it serves clients, ctx is done,
// or ReadyTimeout passes. The caller closes the returned member.
//
// Start fails at once, with an error wrapping ErrDataDirInUse, if another
// process holds the data directory. If it fails for any reason it leaves
// the directory as it found it when etcd never ran on it (a port in use,
// a bad setting): see DataDir.Discard.
func Start(ctx context.Context, c Config) (_ *Member, err error) {
	if err := c.Validate(); err != nil {
		return nil, err
	}
	c = c.withDefaults()
	dir := c.DataDir
	if dir == nil {
		if dir, err = LockDataDir(c.Dir); err != nil {
			return nil, err
		}
		defer func() {
			if err != nil {
				dir.Discard()
			}
		}()
	}
	cfg := embed.NewConfig()
	cfg.Name = c.Name
	cfg.Dir = dir.Path()
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
	// Checked here, with regnode's flag names, before etcd checks it with
	// its own (which, for the client port, are the API's in regnode).
	if err := schemesMatch("listen-client-urls", "etcd-server-", cfg.ListenClientUrls, c.ClientTLS); err != nil {
		return nil, err
	}
	if err := schemesMatch("listen-peer-urls", "peer-", cfg.ListenPeerUrls, c.PeerTLS); err != nil {
		return nil, err
	}
	cfg.ClientTLSInfo = tlsInfo(c.ClientTLS)
	cfg.PeerTLSInfo = tlsInfo(c.PeerTLS)
	cfg.InitialCluster = c.InitialCluster
	cfg.ClusterState = c.ClusterState
	cfg.InitialClusterToken = c.Token
	cfg.LogLevel = c.LogLevel
	cfg.UnsafeNoFsync = c.UnsafeNoFsync
	if c.BcryptCost > 0 {
		cfg.BcryptCost = uint(c.BcryptCost)
	}
	cfg.WatchProgressNotifyInterval = c.ProgressNotifyInterval
	cfg.QuotaBackendBytes = c.QuotaBackendBytes
	// One process, many members in tests: never share the default metrics
	// endpoints or the process-wide zap globals.
	cfg.Metrics = "basic"
	closing := &atomic.Bool{}
	progress := slog.New(slog.DiscardHandler)
	if c.Logger != nil {
		cfg.ZapLoggerBuilder = embed.NewZapLoggerBuilder(zapslog.New(c.Logger, c.LogLevel, closing))
		progress = c.Logger
	}
	if err := cfg.Validate(); err != nil {
		return nil, fmt.Errorf("embedded etcd %s: %w", c.Name, err)
	}
	if err := ctx.Err(); err != nil {
		return nil, fmt.Errorf("embedded etcd %s: not started: %w", c.Name, err)
	}
	progress.Info("starting embedded etcd member", "name", c.Name, "data_dir", cfg.Dir)
	// StartEtcd cannot be cancelled, but it no longer waits on anything
	// unbounded: the one wait without an end (bbolt's flock) was ruled out
	// by LockDataDir. Waiting for the cluster, below, is where time goes.
	e, err := embed.StartEtcd(cfg)
	if err != nil {
		return nil, fmt.Errorf("start embedded etcd %s in %s: %w", c.Name, cfg.Dir, err)
	}
	dir.used = true // etcd ran on it: never discard what it wrote
	progress.Info("waiting for the embedded etcd member to join its cluster", "name", c.Name, "initial_cluster", c.InitialCluster)
	t := time.NewTimer(c.ReadyTimeout)
	defer t.Stop()
	select {
	case <-e.Server.ReadyNotify():
		m := &Member{Etcd: e, closing: closing}
		if c.DataDir == nil {
			m.dir = dir
		}
		return m, nil
	case err := <-e.Err():
		abort(e, closing)
		return nil, fmt.Errorf("embedded etcd %s failed while starting: %w", c.Name, err)
	case <-ctx.Done():
		abort(e, closing)
		return nil, fmt.Errorf("embedded etcd %s: stopped while waiting to join its cluster: %w", c.Name, ctx.Err())
	case <-t.C:
		abort(e, closing)
		return nil, fmt.Errorf("embedded etcd %s: %w after %s (are the other members of %q up?)",
			c.Name, errors.New("not ready"), c.ReadyTimeout, c.InitialCluster)
	}
}

// abort stops a member that never became ready. The server is stopped
// first: Etcd.Close alone waits for client servers that only start once
// the member is ready, so it would wait forever.
func abort(e *embed.Etcd, closing *atomic.Bool) {
	closing.Store(true)
	e.Server.HardStop()
	e.Close()
}
