package probe

import (
	"errors"
	"reflect"
	"testing"

	"github.com/regcluster/registry/internal/configerr/configtest"
)

func TestConfigValidate(t *testing.T) {
	ok, bad := configtest.Accepts[Config], configtest.Refuses[Config]
	configtest.Run(t, DefaultConfig, Config.Validate, ErrInvalidConfig, []configtest.Case[Config]{
		ok("DefaultTimeout 0 (default)", func(c *Config) { c.DefaultTimeout = 0 }),
		ok("DefaultTimeout 1ns", func(c *Config) { c.DefaultTimeout = 1 }),
		bad("DefaultTimeout -1ns", "DefaultTimeout", func(c *Config) { c.DefaultTimeout = -1 }),
	})
}

// The zero Config runs with DefaultConfig's values, and New refuses a
// negative DefaultTimeout (it used to run it as DefaultTimeout).
func TestConfigDefaults(t *testing.T) {
	got := Config{}.withDefaults()
	got.Logger = nil
	if want := DefaultConfig(); !reflect.DeepEqual(got, want) {
		t.Errorf("zero Config runs with %+v, DefaultConfig is %+v", got, want)
	}
	if _, err := New(Config{DefaultTimeout: -1}); !errors.Is(err, ErrInvalidConfig) ||
		err.Error() != "probe: Config.DefaultTimeout must be >= 0 (0: the default), got -1ns" {
		t.Errorf("New: %v", err)
	}
}
