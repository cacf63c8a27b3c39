package watch

import (
	"errors"
	"reflect"
	"testing"
	"time"

	clientv3 "go.etcd.io/etcd/client/v3"

	"github.com/regcluster/registry/internal/configerr/configtest"
)

func TestConfigValidate(t *testing.T) {
	base := func() Config { c := DefaultConfig(); c.Client = new(clientv3.Client); return c }
	ok, bad := configtest.Accepts[Config], configtest.Refuses[Config]
	configtest.Run(t, base, Config.Validate, ErrInvalidConfig, []configtest.Case[Config]{
		bad("Client nil", "Client", func(c *Config) { c.Client = nil }),
		ok("Service set", func(c *Config) { c.Service = "billing" }),
		bad("Service bad", "Service", func(c *Config) { c.Service = "Bad Name" }),
		ok("PageSize 0 (default)", func(c *Config) { c.PageSize = 0 }),
		ok("PageSize 1", func(c *Config) { c.PageSize = 1 }),
		bad("PageSize -1", "PageSize", func(c *Config) { c.PageSize = -1 }),
		ok("PageBytes 0 (default)", func(c *Config) { c.PageBytes = 0 }),
		ok("PageBytes 1", func(c *Config) { c.PageBytes = 1 }),
		bad("PageBytes -1", "PageBytes", func(c *Config) { c.PageBytes = -1 }),
		ok("MinBackoff 0 (default)", func(c *Config) { c.MinBackoff = 0 }),
		bad("MinBackoff -1ns", "MinBackoff", func(c *Config) { c.MinBackoff = -1 }),
		ok("MaxBackoff = MinBackoff", func(c *Config) { c.MaxBackoff = c.MinBackoff }),
		bad("MaxBackoff < MinBackoff", "MaxBackoff", func(c *Config) { c.MaxBackoff = c.MinBackoff - 1 }),
		ok("MaxBackoff 0 under a MinBackoff over its default", func(c *Config) { c.MinBackoff, c.MaxBackoff = time.Minute, 0 }),
		ok("ProgressInterval 0 (default)", func(c *Config) { c.ProgressInterval = 0 }),
		ok("ProgressInterval 1ns", func(c *Config) { c.ProgressInterval = 1 }),
		bad("ProgressInterval -1s", "ProgressInterval", func(c *Config) { c.ProgressInterval = -time.Second }),
	})
}

// The zero Config runs with DefaultConfig's values, and New refuses what
// Validate refuses instead of correcting it.
func TestConfigDefaults(t *testing.T) {
	got := Config{}.withDefaults()
	got.Logger = nil
	if want := DefaultConfig(); !reflect.DeepEqual(got, want) {
		t.Errorf("zero Config runs with %+v, DefaultConfig is %+v", got, want)
	}
	_, err := New(Config{Client: new(clientv3.Client), ProgressInterval: -time.Second})
	if !errors.Is(err, ErrInvalidConfig) || err.Error() != "watch: Config.ProgressInterval must be >= 0 (0: the default), got -1s" {
		t.Errorf("New: %v", err)
	}
}
