package main

import "github.com/regcluster/registry/internal/netproxy"

// newProxy is a cuttable link to target on a free loopback port.
func newProxy(target string) (*netproxy.Proxy, error) {
	return netproxy.New("127.0.0.1:0", target)
}
