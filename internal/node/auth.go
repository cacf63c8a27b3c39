package node

import (
	"context"
	"fmt"
	"path/filepath"
	"time"

	clientv3 "go.etcd.io/etcd/client/v3"

	"github.com/regcluster/registry/internal/server"
	"github.com/regcluster/registry/internal/stopper"
	"github.com/regcluster/registry/internal/token"
)

// AdminTokenFile is the file, in the data dir (--data-dir, also with an
// external etcd), that the first regnode started with --auth writes the
// first admin token to (mode 0600), unless Config.AdminTokenFile names
// another.
const AdminTokenFile = "admin-token"

// adminTokenPath is where this regnode would write the first admin token.
func (c *Config) adminTokenPath() string {
	if c.AdminTokenFile != "" {
		return c.AdminTokenFile
	}
	dir := c.Embed.Dir
	if dir == "" {
		dir = DefaultConfig().Embed.Dir
	}
	return filepath.Join(dir, AdminTokenFile)
}

// startAuth turns scoped tokens on: the first admin token if the registry
// has never had one, the token cache (one etcd watch, run until Close,
// filled before the API serves a call), and the check and the Tokens
// service built on it. Only the token file's path is ever logged.
func (n *Node) startAuth(ctx context.Context) (*server.Auth, *server.Tokens, error) {
	cfg := n.cfg
	bctx, cancel := context.WithTimeout(ctx, 15*time.Second)
	defer cancel()
	file, by, created, err := token.Bootstrap(bctx, n.cli, cfg.Prefix, cfg.adminTokenPath(), cfg.Name)
	if err != nil {
		return nil, nil, fmt.Errorf("auth: first admin token: %w", err)
	}
	if created {
		n.log.Info("auth on: wrote the first admin token (role admin, scope all); keep it, or create others with it and revoke it",
			"file", file)
	} else {
		n.log.Info("auth on: the first admin token was made earlier", "by_regnode", by, "file", file)
	}
	cache, err := token.NewCache(token.Config{Client: n.cli, Prefix: cfg.Prefix, Logger: n.log,
		OnJunk: func(string, error) { n.metrics.JunkSkipped.Inc() }})
	if err != nil {
		return nil, nil, err
	}
	// Not quiesced: it follows etcd until the API has stopped, so every
	// call, the last in flight included, is checked against the tokens
	// as they are.
	if err := n.life.Start(ctx, stopper.Component{Name: "token cache", Run: cache.Run}); err != nil {
		return nil, nil, err
	}
	select {
	case <-cache.Ready():
	case <-bctx.Done():
		return nil, nil, fmt.Errorf("auth: load the tokens from etcd: %w", bctx.Err())
	}
	a, err := server.NewAuth(cache, n.metrics, n.log)
	if err != nil {
		return nil, nil, err
	}
	t, err := server.NewTokens(server.TokensConfig{Cache: cache, Client: n.cli, Prefix: cfg.Prefix,
		Metrics: n.metrics, Logger: n.log})
	if err != nil {
		return nil, nil, err
	}
	return a, t, nil
}

// warnAuthOff warns when this regnode runs without --auth on a registry
// where another regnode turned tokens on: every call it serves bypasses
// them. It only warns (turning auth off for good is an operator's right),
// loudly, once at start.
func (n *Node) warnAuthOff(ctx context.Context) {
	ctx, cancel := context.WithTimeout(ctx, 5*time.Second)
	defer cancel()
	resp, err := n.cli.Get(ctx, token.BootstrapKey(n.cfg.Prefix), clientv3.WithCountOnly())
	if err == nil && resp.Count > 0 {
		n.log.Warn("this registry has scoped tokens (a regnode ran with --auth), but this regnode runs without --auth: "+
			"it serves every call to anyone who reaches it; start it with --auth like the others", "prefix", n.cfg.Prefix)
	}
}
