package probe

import (
	"errors"
	"reflect"
	"strings"
	"testing"

	"github.com/regcluster/registry/internal/configerr/configtest"
)

func TestConfigValidate(t *testing.T) {
	ok, bad := configtest.Accepts[Config], configtest.Refuses[Config]
	configtest.Run(t, DefaultConfig, Config.Validate, ErrInvalidConfig, []configtest.Case[Config]{
		ok("DefaultTimeout 0 (default)", func(c *Config) { c.DefaultTimeout = 0 }),
		ok("DefaultTimeout 1ns", func(c *Config) { c.DefaultTimeout = 1 }),
		bad("DefaultTimeout -1ns", "DefaultTimeout", func(c *Config) { c.DefaultTimeout = -1 }),
		ok("Agent zero (default)", func(c *Config) { c.Agent = Agent{} }),
		ok("Agent regnode's", func(c *Config) { c.Agent = Agent{Version: "0.1.0", Node: "host-1/:7400"} }),
		ok("Agent.Node with spaces", func(c *Config) { c.Agent.Node = "rack 3 node" }),
		bad("Agent.Version with a space", "Agent.Version", func(c *Config) { c.Agent.Version = "0.1 beta" }),
		bad("Agent.Version (devel)", "Agent.Version", func(c *Config) { c.Agent.Version = "(devel)" }),
		bad("Agent.Node with a parenthesis", "Agent.Node", func(c *Config) { c.Agent.Node = "a)b" }),
		bad("Agent.Node with a newline", "Agent.Node", func(c *Config) { c.Agent.Node = "a\r\nX-Evil: 1" }),
		bad("Agent.Node not ASCII", "Agent.Node", func(c *Config) { c.Agent.Node = "nœud" }),
		bad("Agent.Node too long", "Agent.Node", func(c *Config) { c.Agent.Node = strings.Repeat("n", maxAgentField+1) }),
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
