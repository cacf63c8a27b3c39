package prober

import (
	"errors"
	"reflect"
	"testing"
	"time"

	"github.com/regcluster/registry/cache"
	"github.com/regcluster/registry/health"
	"github.com/regcluster/registry/internal/configerr/configtest"
	"github.com/regcluster/registry/probe"
	"github.com/regcluster/registry/store"
)

func validBase() Config {
	c := DefaultConfig()
	c.Store, c.View, c.Probe = new(store.Store), cache.New().Snapshot, new(probe.Checker)
	return c
}

func TestConfigValidate(t *testing.T) {
	ok, bad := configtest.Accepts[Config], configtest.Refuses[Config]
	configtest.Run(t, validBase, Config.Validate, ErrInvalidConfig, []configtest.Case[Config]{
		bad("Store nil", "Store", func(c *Config) { c.Store = nil }),
		bad("View nil", "View", func(c *Config) { c.View = nil }),
		bad("Probe nil", "Probe", func(c *Config) { c.Probe = nil }),
		ok("Thresholds zero (default)", func(c *Config) { c.Thresholds = health.Thresholds{} }),
		bad("Thresholds partly set", "Thresholds.FailuresToUnavailable", func(c *Config) { c.Thresholds = health.Thresholds{FailuresToDegraded: 1} }),
		bad("Thresholds.Slow 0", "Thresholds.Slow", func(c *Config) { c.Thresholds.Slow = 0 }),
		ok("Interval 0 (default)", func(c *Config) { c.Interval = 0 }),
		ok("Interval = Floor", func(c *Config) { c.Interval = c.Floor }),
		bad("Interval below Floor", "Interval", func(c *Config) { c.Interval = c.Floor - 1 }),
		bad("Interval negative", "Interval", func(c *Config) { c.Interval = -time.Second }),
		ok("Floor 0 (default)", func(c *Config) { c.Floor = 0 }),
		bad("Floor negative", "Floor", func(c *Config) { c.Floor = -1 }),
		ok("Concurrency 0 (default)", func(c *Config) { c.Concurrency = 0 }),
		ok("Concurrency 1", func(c *Config) { c.Concurrency = 1 }),
		bad("Concurrency -1", "Concurrency", func(c *Config) { c.Concurrency = -1 }),
		ok("Writers 0 (default)", func(c *Config) { c.Writers = 0 }),
		ok("Writers 1", func(c *Config) { c.Writers = 1 }),
		bad("Writers -1", "Writers", func(c *Config) { c.Writers = -1 }),
		ok("WriteTimeout 0 (default)", func(c *Config) { c.WriteTimeout = 0 }),
		bad("WriteTimeout -1ns", "WriteTimeout", func(c *Config) { c.WriteTimeout = -1 }),
		ok("OrphanRetention negative (never)", func(c *Config) { c.OrphanRetention = -1 }),
	})
}

// The zero Config runs with DefaultConfig's values, and New refuses what
// Validate refuses (it used to run a negative Concurrency as 64).
func TestConfigDefaults(t *testing.T) {
	got := Config{}.withDefaults()
	got.Logger = nil
	if want := DefaultConfig(); !reflect.DeepEqual(got, want) {
		t.Errorf("zero Config runs with %+v, DefaultConfig is %+v", got, want)
	}
	c := validBase()
	c.Concurrency = -1
	_, err := New(c)
	if !errors.Is(err, ErrInvalidConfig) || err.Error() != "prober: Config.Concurrency must be >= 0 (0: the default), got -1" {
		t.Errorf("New: %v", err)
	}
	c = validBase()
	c.Thresholds.SuccessesToHealthy = 0
	if _, err := New(c); !errors.Is(err, ErrInvalidConfig) {
		t.Errorf("New with a zero SuccessesToHealthy: %v", err)
	} else {
		t.Log(err)
	}
}

// zeroChecker is a Checker of the zero probe.Config, which is valid.
func zeroChecker() *probe.Checker {
	c, err := probe.New(probe.Config{})
	if err != nil {
		panic(err)
	}
	return c
}
