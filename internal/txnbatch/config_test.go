package txnbatch

import (
	"errors"
	"reflect"
	"testing"

	clientv3 "go.etcd.io/etcd/client/v3"

	"github.com/regcluster/registry/internal/configerr/configtest"
)

func TestConfigValidate(t *testing.T) {
	base := func() Config { c := DefaultConfig(); c.Client = new(clientv3.Client); return c }
	ok, bad := configtest.Accepts[Config], configtest.Refuses[Config]
	configtest.Run(t, base, Config.Validate, ErrInvalidConfig, []configtest.Case[Config]{
		bad("Client nil", "Client", func(c *Config) { c.Client = nil }),
		ok("MaxOps 0 (default)", func(c *Config) { c.MaxOps = 0 }),
		ok("MaxOps 128", func(c *Config) { c.MaxOps = 128 }),
		bad("MaxOps 129", "MaxOps", func(c *Config) { c.MaxOps = 129 }),
		bad("MaxOps -1", "MaxOps", func(c *Config) { c.MaxOps = -1 }),
		ok("MaxBytes 1", func(c *Config) { c.MaxBytes = 1 }),
		bad("MaxBytes -1", "MaxBytes", func(c *Config) { c.MaxBytes = -1 }),
		ok("InFlight 1", func(c *Config) { c.InFlight = 1 }),
		bad("InFlight -1", "InFlight", func(c *Config) { c.InFlight = -1 }),
		ok("Linger 0 (at once)", func(c *Config) { c.Linger = 0 }),
		bad("Linger -1ns", "Linger", func(c *Config) { c.Linger = -1 }),
		ok("Timeout 0 (default)", func(c *Config) { c.Timeout = 0 }),
		bad("Timeout -1ns", "Timeout", func(c *Config) { c.Timeout = -1 }),
	})
}

func TestConfigDefaults(t *testing.T) {
	got := Config{}.withDefaults()
	got.Logger = nil
	if want := DefaultConfig(); !reflect.DeepEqual(got, want) {
		t.Errorf("zero Config runs with %+v, DefaultConfig is %+v", got, want)
	}
	if _, err := New(Config{Client: new(clientv3.Client), InFlight: -1}); !errors.Is(err, ErrInvalidConfig) ||
		err.Error() != "txnbatch: Config.InFlight must be >= 0 (0: the default), got -1" {
		t.Errorf("New: %v", err)
	}
}
