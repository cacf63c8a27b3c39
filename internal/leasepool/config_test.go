package leasepool

import (
	"errors"
	"reflect"
	"testing"

	clientv3 "go.etcd.io/etcd/client/v3"

	"github.com/regcluster/registry/internal/configerr/configtest"
)

func TestConfigValidate(t *testing.T) {
	base := func() Config {
		c := DefaultConfig()
		c.Client, c.Renewer = new(clientv3.Client), new(Renewer)
		return c
	}
	ok, bad := configtest.Accepts[Config], configtest.Refuses[Config]
	configtest.Run(t, base, Config.Validate, ErrInvalidConfig, []configtest.Case[Config]{
		bad("Client nil", "Client", func(c *Config) { c.Client = nil }),
		bad("Renewer nil", "Renewer", func(c *Config) { c.Renewer = nil }),
		ok("Size 0 (default)", func(c *Config) { c.Size = 0 }),
		ok("Size 1", func(c *Config) { c.Size = 1 }),
		bad("Size -1", "Size", func(c *Config) { c.Size = -1 }),
		ok("TTLs 1", func(c *Config) { c.TTLs = 1 }),
		bad("TTLs -1", "TTLs", func(c *Config) { c.TTLs = -1 }),
		ok("Grants 1", func(c *Config) { c.Grants = 1 }),
		bad("Grants -1", "Grants", func(c *Config) { c.Grants = -1 }),
		ok("Tick 1ns", func(c *Config) { c.Tick = 1 }),
		bad("Tick -1ns", "Tick", func(c *Config) { c.Tick = -1 }),
	})
}

func TestConfigDefaults(t *testing.T) {
	got := Config{}.withDefaults()
	got.Logger = nil
	if want := DefaultConfig(); !reflect.DeepEqual(got, want) {
		t.Errorf("zero Config runs with %+v, DefaultConfig is %+v", got, want)
	}
	if _, err := New(Config{Client: new(clientv3.Client), Renewer: new(Renewer), Tick: -1}); !errors.Is(err, ErrInvalidConfig) ||
		err.Error() != "leasepool: Config.Tick must be >= 0 (0: the default), got -1ns" {
		t.Errorf("New: %v", err)
	}
}
