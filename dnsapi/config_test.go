package dnsapi

import (
	"errors"
	"testing"
	"time"

	"github.com/regcluster/registry/internal/configerr"
	"github.com/regcluster/registry/internal/configerr/configtest"
)

// Each setting at its boundaries; no zero value is taken for a default.
func TestConfigValidate(t *testing.T) {
	type C = Config
	ok, bad := configtest.Accepts[C], configtest.Refuses[C]
	base := func() C { c := DefaultConfig(); c.Listen = "127.0.0.1:0"; return c }
	configtest.Run(t, base, C.Validate, ErrInvalidConfig, []configtest.Case[C]{
		bad("Listen empty", "Listen", func(c *C) { c.Listen = "" }),
		ok("Listen IPv6", func(c *C) { c.Listen = "[::1]:8600" }),
		bad("Listen port 65536", "Listen", func(c *C) { c.Listen = "127.0.0.1:65536" }),
		bad("Domain empty", "Domain", func(c *C) { c.Domain = "" }),
		bad("Domain with a space", "Domain", func(c *C) { c.Domain = "my registry." }),
		ok("Domain of two labels", func(c *C) { c.Domain = "svc.example" }),
		bad("TTL 0", "TTL", func(c *C) { c.TTL = 0 }),
		ok("TTL 1s", func(c *C) { c.TTL = time.Second }),
		bad("Rate 0", "Rate", func(c *C) { c.Rate = 0 }),
		ok("Rate 0.5", func(c *C) { c.Rate = 0.5 }),
		bad("Burst -1", "Burst", func(c *C) { c.Burst = -1 }),
		bad("MaxSources 0", "MaxSources", func(c *C) { c.MaxSources = 0 }),
		ok("MaxUDPSize 512", func(c *C) { c.MaxUDPSize = 512 }),
		bad("MaxUDPSize 65536", "MaxUDPSize", func(c *C) { c.MaxUDPSize = 65536 }),
	})
	_, err := New(base())
	var ce *configerr.Error
	if !errors.As(err, &ce) || ce.Field != "View" || !errors.Is(err, ErrInvalidConfig) {
		t.Fatalf("New without View: %v", err)
	}
}
