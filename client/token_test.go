package client_test

import (
	"crypto/tls"
	"errors"
	"strings"
	"testing"

	"github.com/regcluster/registry/client"
	"github.com/regcluster/registry/internal/token"
)

// A token goes in plaintext only to this host, unless the caller says
// so; a malformed one is refused without being quoted.
func TestTokenTransport(t *testing.T) {
	tok := token.New()
	for _, tc := range []struct {
		name string
		cfg  client.Config
		err  error // nil: New succeeds
	}{
		{"loopback v4", client.Config{Endpoints: []string{"127.0.0.1:7400"}, Token: tok}, nil},
		{"loopback v6", client.Config{Endpoints: []string{"[::1]:7400"}, Token: tok}, nil},
		{"localhost", client.Config{Endpoints: []string{"localhost:7400"}, Token: tok}, nil},
		{"remote plaintext", client.Config{Endpoints: []string{"127.0.0.1:7400", "10.0.0.1:7400"}, Token: tok}, client.ErrInsecureToken},
		{"remote name plaintext", client.Config{Endpoints: []string{"regnode-1:7400"}, Token: tok}, client.ErrInsecureToken},
		{"remote allowed", client.Config{Endpoints: []string{"10.0.0.1:7400"}, Token: tok, AllowInsecureToken: true}, nil},
		{"remote TLS", client.Config{Endpoints: []string{"10.0.0.1:7400"}, Token: tok, TLS: &tls.Config{}}, nil},
		{"no token", client.Config{Endpoints: []string{"10.0.0.1:7400"}}, nil},
		{"malformed", client.Config{Endpoints: []string{"127.0.0.1:7400"}, Token: tok + "x"}, token.ErrMalformed},
	} {
		c, err := client.New(tc.cfg)
		if c != nil {
			c.Close()
		}
		switch {
		case tc.err == nil && err != nil:
			t.Errorf("%s: New = %v", tc.name, err)
		case tc.err != nil && !errors.Is(err, tc.err):
			t.Errorf("%s: New = %v, want %v", tc.name, err, tc.err)
		case err != nil && strings.Contains(err.Error(), tok[len(token.Prefix):]):
			t.Errorf("%s: the error quotes the token: %v", tc.name, err)
		}
	}
}
