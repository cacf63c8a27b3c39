package httpapi_test

import (
	"testing"

	"google.golang.org/grpc"

	"github.com/regcluster/registry/httpapi"
	"github.com/regcluster/registry/internal/configerr/configtest"
)

func TestConfigValidate(t *testing.T) {
	type C = httpapi.Config
	base := func() C { c := httpapi.DefaultConfig(); c.Conn = new(grpc.ClientConn); return c }
	ok, bad := configtest.Accepts[C], configtest.Refuses[C]
	configtest.Run(t, base, func(c C) error { return c.Validate() }, httpapi.ErrInvalidConfig, []configtest.Case[C]{
		bad("Conn nil", "Conn", func(c *C) { c.Conn = nil }),
		ok("CallTimeout 0 (default)", func(c *C) { c.CallTimeout = 0 }),
		ok("CallTimeout 1ns", func(c *C) { c.CallTimeout = 1 }),
		bad("CallTimeout -1ns", "CallTimeout", func(c *C) { c.CallTimeout = -1 }),
	})
	if _, err := httpapi.New(httpapi.Config{Conn: new(grpc.ClientConn), CallTimeout: -1}); err == nil {
		t.Error("New with a negative CallTimeout succeeded")
	}
}
