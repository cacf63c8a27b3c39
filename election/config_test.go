package election

import (
	"errors"
	"reflect"
	"testing"
	"time"

	clientv3 "go.etcd.io/etcd/client/v3"

	"github.com/regcluster/registry/internal/configerr/configtest"
)

func TestConfigValidate(t *testing.T) {
	base := func() Config { c := DefaultConfig(); c.Client, c.Name = new(clientv3.Client), "n1"; return c }
	ok, bad := configtest.Accepts[Config], configtest.Refuses[Config]
	configtest.Run(t, base, Config.Validate, ErrInvalidConfig, []configtest.Case[Config]{
		bad("Client nil", "Client", func(c *Config) { c.Client = nil }),
		bad("Name empty", "Name", func(c *Config) { c.Name = "" }),
		ok("SessionTTL 0 (default)", func(c *Config) { c.SessionTTL = 0 }),
		ok("SessionTTL at MinSessionTTL", func(c *Config) { c.SessionTTL = MinSessionTTL }),
		bad("SessionTTL 1s", "SessionTTL", func(c *Config) { c.SessionTTL = time.Second }),
		bad("SessionTTL not whole seconds", "SessionTTL", func(c *Config) { c.SessionTTL = 2500 * time.Millisecond }),
		bad("SessionTTL negative", "SessionTTL", func(c *Config) { c.SessionTTL = -10 * time.Second }),
	})
}

func TestConfigDefaults(t *testing.T) {
	got := Config{}.withDefaults()
	got.Logger = nil
	if want := DefaultConfig(); !reflect.DeepEqual(got, want) {
		t.Errorf("zero Config runs with %+v, DefaultConfig is %+v", got, want)
	}
	_, err := New(Config{Client: new(clientv3.Client), Name: "n1", SessionTTL: time.Second})
	if !errors.Is(err, ErrInvalidConfig) || err.Error() != "election: Config.SessionTTL must be whole seconds, at least 2s (0: the default), got 1s" {
		t.Errorf("New: %v", err)
	}
}
