package client

import (
	"testing"

	"github.com/regcluster/registry/internal/server"
)

// The SDK branches on the reasons regnode documents; they must not drift.
func TestReasonsMatchTheServer(t *testing.T) {
	for got, want := range map[string]string{
		errorDomain:            server.ErrorDomain,
		reasonRevisionAhead:    server.ReasonRevisionAhead,
		reasonPageTokenExpired: server.ReasonPageTokenExpired,
	} {
		if got != want {
			t.Errorf("SDK has %q, the server %q", got, want)
		}
	}
}
