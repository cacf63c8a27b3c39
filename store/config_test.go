package store

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
		ok("PageSize 0 (default)", func(c *Config) { c.PageSize = 0 }),
		ok("PageSize 1", func(c *Config) { c.PageSize = 1 }),
		bad("PageSize -1", "PageSize", func(c *Config) { c.PageSize = -1 }),
		ok("Now nil (default)", func(c *Config) { c.Now = nil }),
	})
}

// The zero Config runs with DefaultConfig's values, and New refuses a
// negative PageSize (it used to run it as 1000).
func TestConfigDefaults(t *testing.T) {
	got := Config{}.withDefaults()
	if got.Logger == nil || got.Now == nil {
		t.Fatalf("zero Config runs with no Logger or Now: %+v", got)
	}
	got.Logger, got.Now = nil, nil
	want := DefaultConfig()
	want.Now = nil // funcs compare equal only when nil
	if !reflect.DeepEqual(got, want) {
		t.Errorf("zero Config runs with %+v, DefaultConfig is %+v", got, want)
	}
	if _, err := New(Config{Client: new(clientv3.Client), PageSize: -1}); !errors.Is(err, ErrInvalidConfig) ||
		err.Error() != "store: Config.PageSize must be >= 0 (0: the default), got -1" {
		t.Errorf("New: %v", err)
	}
}
