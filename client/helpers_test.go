package client_test

import (
	"net/url"
	"testing"

	"github.com/regcluster/registry/internal/regnodetest"
	"github.com/regcluster/registry/store"
)

func mustURL(t *testing.T, s string) *url.URL {
	t.Helper()
	u, err := url.Parse(s)
	if err != nil {
		t.Fatal(err)
	}
	return u
}

func storeFor(t *testing.T, rn *regnodetest.Regnode) (*store.Store, error) {
	t.Helper()
	return store.New(store.Config{Client: rn.Etcd, Prefix: rn.Prefix})
}
