package token_test

import (
	"testing"

	clientv3 "go.etcd.io/etcd/client/v3"

	"github.com/regcluster/registry/internal/configerr/configtest"
	"github.com/regcluster/registry/internal/token"
)

func TestConfigValidate(t *testing.T) {
	type C = token.Config
	base := func() C { c := token.DefaultConfig(); c.Client = new(clientv3.Client); return c }
	ok, bad := configtest.Accepts[C], configtest.Refuses[C]
	configtest.Run(t, base, C.Validate, token.ErrInvalidConfig, []configtest.Case[C]{
		bad("Client nil", "Client", func(c *C) { c.Client = nil }),
		ok("Prefix /", func(c *C) { c.Prefix = "/" }),
		bad("Prefix empty", "Prefix", func(c *C) { c.Prefix = "" }),
		bad("Prefix relative", "Prefix", func(c *C) { c.Prefix = "registry/" }),
	})
	if _, err := token.NewCache(token.Config{Prefix: "/x/"}); err == nil {
		t.Error("NewCache without a Client succeeded")
	}
}
