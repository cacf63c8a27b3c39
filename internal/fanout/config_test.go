package fanout

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
		ok("RingSize 0 (default)", func(c *Config) { c.RingSize = 0 }),
		ok("RingSize 1", func(c *Config) { c.RingSize = 1 }),
		bad("RingSize -1", "RingSize", func(c *Config) { c.RingSize = -1 }),
		ok("QueueSize 0 (default)", func(c *Config) { c.QueueSize = 0 }),
		ok("QueueSize 1", func(c *Config) { c.QueueSize = 1 }),
		bad("QueueSize -1", "QueueSize", func(c *Config) { c.QueueSize = -1 }),
		ok("CatchUpTimeout 0 (default)", func(c *Config) { c.CatchUpTimeout = 0 }),
		ok("CatchUpTimeout 1ns", func(c *Config) { c.CatchUpTimeout = 1 }),
		bad("CatchUpTimeout -1ns", "CatchUpTimeout", func(c *Config) { c.CatchUpTimeout = -1 }),
		ok("ProgressInterval 0 (default)", func(c *Config) { c.ProgressInterval = 0 }),
		bad("ProgressInterval -1ns", "ProgressInterval", func(c *Config) { c.ProgressInterval = -1 }),
	})
}

// The zero Config runs with DefaultConfig's values, and New refuses what
// Validate refuses instead of correcting it (it used to make a negative
// QueueSize 1024).
func TestConfigDefaults(t *testing.T) {
	got := Config{}.withDefaults()
	got.Logger = nil
	if want := DefaultConfig(); !reflect.DeepEqual(got, want) {
		t.Errorf("zero Config runs with %+v, DefaultConfig is %+v", got, want)
	}
	_, err := New(Config{Client: new(clientv3.Client), QueueSize: -1})
	if !errors.Is(err, ErrInvalidConfig) || err.Error() != "fanout: Config.QueueSize must be >= 0 (0: the default), got -1" {
		t.Errorf("New: %v", err)
	}
	if _, err := New(Config{Client: new(clientv3.Client), CatchUpTimeout: 3 * time.Second}); err != nil {
		t.Errorf("New: %v", err)
	}
}
