package lease

import (
	"context"
	"errors"
	"reflect"
	"testing"
	"time"

	"github.com/regcluster/registry/internal/configerr/configtest"
	"github.com/regcluster/registry/record"
)

func TestConfigValidate(t *testing.T) {
	ok, bad := configtest.Accepts[Config], configtest.Refuses[Config]
	configtest.Run(t, DefaultConfig, Config.Validate, ErrInvalidConfig, []configtest.Case[Config]{
		ok("TTL 0 (default)", func(c *Config) { c.TTL = 0 }),
		ok("TTL at MinTTL", func(c *Config) { c.TTL, c.KeepAliveInterval = record.MinTTL, 0 }),
		bad("TTL below MinTTL", "TTL", func(c *Config) { c.TTL = record.MinTTL - 1 }),
		ok("TTL at MaxTTL", func(c *Config) { c.TTL = record.MaxTTL }),
		bad("TTL above MaxTTL", "TTL", func(c *Config) { c.TTL = record.MaxTTL + time.Second }),
		ok("KeepAliveInterval 0 (TTL/3)", func(c *Config) { c.KeepAliveInterval = 0 }),
		ok("KeepAliveInterval just under TTL", func(c *Config) { c.KeepAliveInterval = c.TTL - 1 }),
		bad("KeepAliveInterval = TTL", "KeepAliveInterval", func(c *Config) { c.KeepAliveInterval = c.TTL }),
		bad("KeepAliveInterval -1ns", "KeepAliveInterval", func(c *Config) { c.KeepAliveInterval = -1 }),
		bad("DefaultConfig's KeepAliveInterval under a shorter TTL", "KeepAliveInterval", func(c *Config) { c.TTL = record.MinTTL }),
		ok("DrainGrace 0 (default)", func(c *Config) { c.DrainGrace = 0 }),
		bad("DrainGrace -1ns", "DrainGrace", func(c *Config) { c.DrainGrace = -1 }),
		ok("MinBackoff 0 (default)", func(c *Config) { c.MinBackoff = 0 }),
		bad("MinBackoff -1ns", "MinBackoff", func(c *Config) { c.MinBackoff = -1 }),
		ok("MaxBackoff = MinBackoff", func(c *Config) { c.MaxBackoff = c.MinBackoff }),
		bad("MaxBackoff < MinBackoff", "MaxBackoff", func(c *Config) { c.MaxBackoff = c.MinBackoff - 1 }),
		ok("MaxBackoff 0 under a MinBackoff over its default", func(c *Config) { c.MinBackoff, c.MaxBackoff = time.Minute, 0 }),
	})
}

// The zero Config runs with DefaultConfig's values; a bad TTL still wraps
// record.ErrInvalid; Start refuses what Validate refuses before any call
// (it used to run a negative MinBackoff as 100ms).
func TestConfigDefaults(t *testing.T) {
	got := Config{}.withDefaults()
	got.Logger = nil
	if want := DefaultConfig(); !reflect.DeepEqual(got, want) {
		t.Errorf("zero Config runs with %+v, DefaultConfig is %+v", got, want)
	}
	if err := (Config{TTL: time.Second}).Validate(); !errors.Is(err, record.ErrInvalid) {
		t.Errorf("TTL 1s: %v does not wrap record.ErrInvalid", err)
	}
	_, err := Start(context.Background(), nil, nil, Config{MinBackoff: -time.Second})
	if !errors.Is(err, ErrInvalidConfig) || err.Error() != "lease: Config.MinBackoff must be >= 0 (0: the default), got -1s" {
		t.Errorf("Start: %v", err)
	}
}
