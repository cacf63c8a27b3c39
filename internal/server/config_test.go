package server

import (
	"errors"
	"reflect"
	"testing"
	"time"

	clientv3 "go.etcd.io/etcd/client/v3"

	"github.com/regcluster/registry/internal/configerr/configtest"
	"github.com/regcluster/registry/internal/metrics"
	"github.com/regcluster/registry/internal/token"
	"github.com/regcluster/registry/store"
)

func TestConfigValidate(t *testing.T) {
	base := func() Config {
		c := DefaultConfig()
		c.Store, c.Metrics = new(store.Store), new(metrics.Metrics)
		return c
	}
	ok, bad := configtest.Accepts[Config], configtest.Refuses[Config]
	configtest.Run(t, base, Config.Validate, ErrInvalidConfig, []configtest.Case[Config]{
		bad("Store nil", "Store", func(c *Config) { c.Store = nil }),
		bad("Metrics nil", "Metrics", func(c *Config) { c.Metrics = nil }),
		ok("CallTimeout 0 (default)", func(c *Config) { c.CallTimeout = 0 }),
		ok("CallTimeout 1ns", func(c *Config) { c.CallTimeout = 1 }),
		bad("CallTimeout -1ns", "CallTimeout", func(c *Config) { c.CallTimeout = -1 }),
		ok("Operator nil (default)", func(c *Config) { c.Operator = nil }),
		ok("LimitKey nil (default)", func(c *Config) { c.LimitKey = nil }),
	})
}

func TestTokensConfigValidate(t *testing.T) {
	base := func() TokensConfig {
		c := DefaultTokensConfig()
		c.Cache, c.Client, c.Metrics = new(token.Cache), new(clientv3.Client), new(metrics.Metrics)
		return c
	}
	ok, bad := configtest.Accepts[TokensConfig], configtest.Refuses[TokensConfig]
	configtest.Run(t, base, TokensConfig.Validate, ErrInvalidConfig, []configtest.Case[TokensConfig]{
		bad("Cache nil", "Cache", func(c *TokensConfig) { c.Cache = nil }),
		bad("Client nil", "Client", func(c *TokensConfig) { c.Client = nil }),
		bad("Metrics nil", "Metrics", func(c *TokensConfig) { c.Metrics = nil }),
		ok("CallTimeout 0 (default)", func(c *TokensConfig) { c.CallTimeout = 0 }),
		bad("CallTimeout -1ns", "CallTimeout", func(c *TokensConfig) { c.CallTimeout = -1 }),
	})
}

// The zero Configs run with the defaults stated, and New and NewTokens
// refuse a negative CallTimeout (they used to run it as 5s).
func TestConfigDefaults(t *testing.T) {
	got := Config{}.withDefaults()
	if got.Logger == nil || got.Operator == nil || got.LimitKey == nil || got.CallTimeout != DefaultConfig().CallTimeout {
		t.Errorf("zero Config runs with %+v", got)
	}
	gt := TokensConfig{}.withDefaults()
	gt.Logger = nil
	if want := DefaultTokensConfig(); !reflect.DeepEqual(gt, want) {
		t.Errorf("zero TokensConfig runs with %+v, DefaultTokensConfig is %+v", gt, want)
	}
	_, err := New(Config{Store: new(store.Store), Metrics: new(metrics.Metrics), CallTimeout: -time.Second})
	if !errors.Is(err, ErrInvalidConfig) || err.Error() != "server: Config.CallTimeout must be >= 0 (0: the default), got -1s" {
		t.Errorf("New: %v", err)
	}
	_, err = NewTokens(TokensConfig{Cache: new(token.Cache), Client: new(clientv3.Client), Metrics: new(metrics.Metrics), CallTimeout: -time.Second})
	if !errors.Is(err, ErrInvalidConfig) || err.Error() != "server: TokensConfig.CallTimeout must be >= 0 (0: the default), got -1s" {
		t.Errorf("NewTokens: %v", err)
	}
}
