package peerlimit_test

import (
	"math"
	"testing"

	"github.com/regcluster/registry/internal/configerr/configtest"
	"github.com/regcluster/registry/internal/peerlimit"
)

func TestConfigValidateFields(t *testing.T) {
	type C = peerlimit.Config
	ok, bad := configtest.Accepts[C], configtest.Refuses[C]
	configtest.Run(t, peerlimit.DefaultConfig, C.Validate, peerlimit.ErrInvalidConfig, []configtest.Case[C]{
		ok("WriteRate tiny", func(c *C) { c.WriteRate = 0.001 }),
		ok("WriteRate +Inf", func(c *C) { c.WriteRate = math.Inf(1) }),
		bad("WriteRate 0", "WriteRate", func(c *C) { c.WriteRate = 0 }),
		bad("WriteRate NaN", "WriteRate", func(c *C) { c.WriteRate = math.NaN() }),
		ok("WriteBurst 1", func(c *C) { c.WriteBurst = 1 }),
		bad("WriteBurst 0", "WriteBurst", func(c *C) { c.WriteBurst = 0 }),
		ok("KeepAliveRate tiny", func(c *C) { c.KeepAliveRate = 0.001 }),
		bad("KeepAliveRate -1", "KeepAliveRate", func(c *C) { c.KeepAliveRate = -1 }),
		ok("KeepAliveBurst 1", func(c *C) { c.KeepAliveBurst = 1 }),
		bad("KeepAliveBurst 0", "KeepAliveBurst", func(c *C) { c.KeepAliveBurst = 0 }),
		ok("MaxStreams 1", func(c *C) { c.MaxStreams = 1 }),
		bad("MaxStreams 0", "MaxStreams", func(c *C) { c.MaxStreams = 0 }),
		ok("MaxRegistrations 1", func(c *C) { c.MaxRegistrations = 1 }),
		bad("MaxRegistrations 0", "MaxRegistrations", func(c *C) { c.MaxRegistrations = 0 }),
		ok("MaxWritesInFlight 1", func(c *C) { c.MaxWritesInFlight = 1 }),
		bad("MaxWritesInFlight 0", "MaxWritesInFlight", func(c *C) { c.MaxWritesInFlight = 0 }),
	})
	if err := peerlimit.Unlimited().Validate(); err != nil {
		t.Errorf("Unlimited: %v", err)
	}
}
