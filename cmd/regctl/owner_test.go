package main

import (
	"context"
	"testing"

	"github.com/regcluster/registry/internal/etcdtest"
	"github.com/regcluster/registry/internal/node"
	"github.com/regcluster/registry/internal/regnodetest"
	registryv1 "github.com/regcluster/registry/proto/registry/v1"
)

// regctl deregister is an operator's (it holds no registration secret):
// on a regnode that allows no operator deregister it fails with one line
// naming the missing secret, exit 1, and etcd does not move.
func TestDeregisterWithoutSecretRefused(t *testing.T) {
	m := etcdtest.Start(t, false)
	rn := regnodetest.StartWith(t, node.Config{EtcdEndpoints: []string{m.ClientURL}, OperatorDeregister: "none"}, m.ClientURL)
	api := apiClient(t, rn.Addr)
	seed(t, api, &registryv1.Instance{Service: "orders", Id: "o-1", Address: "10.0.0.1:80"})
	head := func() int64 {
		resp, err := rn.Etcd.Get(context.Background(), "\x00")
		if err != nil {
			t.Fatal(err)
		}
		return resp.Header.Revision
	}
	before := head()
	mustFail(t, ctlOf(t, rn.Addr)("deregister", "orders/o-1"), 1, "secret is required")
	if after := head(); after != before || stored(t, rn, "orders", "o-1") == nil {
		t.Fatalf("a refused deregister moved etcd from revision %d to %d, or deleted the record", before, after)
	}
}
