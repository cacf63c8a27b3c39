package node_test

import (
	"errors"
	"net"
	"os"
	"strings"
	"testing"
	"time"

	"github.com/regcluster/registry/dnsapi"
	"github.com/regcluster/registry/internal/configerr/configtest"
	"github.com/regcluster/registry/internal/node"
	"github.com/regcluster/registry/internal/peerlimit"
)

// Each setting Validate checks, at its boundaries: refusals name the
// Config field (cmd/regnode maps it to the flag) and wrap
// node.ErrInvalidConfig; a nested component's keep its own sentinel too.
func TestConfigValidateFields(t *testing.T) {
	type C = node.Config
	ok, bad := configtest.Accepts[C], configtest.Refuses[C]
	configtest.Run(t, node.DefaultConfig, func(c C) error { return c.Validate() }, node.ErrInvalidConfig, []configtest.Case[C]{
		bad("Listen not host:port", "Listen", func(c *C) { c.Listen = "nope" }),
		ok("MetricsListen off", func(c *C) { c.MetricsListen = "off" }),
		bad("MetricsListen junk", "MetricsListen", func(c *C) { c.MetricsListen = "x" }),
		ok("AdvertiseAddress a DNS name", func(c *C) { c.AdvertiseAddress = "regnode-0.regnode-peers.ns.svc:7400" }),
		ok("AdvertiseAddress an IPv6 address", func(c *C) { c.AdvertiseAddress = "[fd00::2]:7400" }),
		ok("AdvertiseAddress port 65535", func(c *C) { c.AdvertiseAddress = "10.0.0.1:65535" }),
		bad("AdvertiseAddress not host:port", "AdvertiseAddress", func(c *C) { c.AdvertiseAddress = "regnode-0" }),
		bad("AdvertiseAddress 0.0.0.0", "AdvertiseAddress", func(c *C) { c.AdvertiseAddress = "0.0.0.0:7400" }),
		bad("AdvertiseAddress ::", "AdvertiseAddress", func(c *C) { c.AdvertiseAddress = "[::]:7400" }),
		bad("AdvertiseAddress no host", "AdvertiseAddress", func(c *C) { c.AdvertiseAddress = ":7400" }),
		bad("AdvertiseAddress port 0", "AdvertiseAddress", func(c *C) { c.AdvertiseAddress = "10.0.0.1:0" }),
		bad("AdvertiseAddress port 65536", "AdvertiseAddress", func(c *C) { c.AdvertiseAddress = "10.0.0.1:65536" }),
		bad("AdvertiseAddress port by name", "AdvertiseAddress", func(c *C) { c.AdvertiseAddress = "10.0.0.1:http" }),
		bad("AdvertiseAddress not a host name", "AdvertiseAddress", func(c *C) { c.AdvertiseAddress = "bad_host:7400" }),
		bad("AdvertiseAddress a label ending in '-'", "AdvertiseAddress", func(c *C) { c.AdvertiseAddress = "regnode-.peers:7400" }),
		bad("EtcdEndpoints empty entry", "EtcdEndpoints", func(c *C) { c.EtcdEndpoints = []string{"http://127.0.0.1:2379", " "} }),
		ok("SessionTTL 0 (default)", func(c *C) { c.SessionTTL = 0 }),
		ok("SessionTTL 2s", func(c *C) { c.SessionTTL = 2 * time.Second }),
		bad("SessionTTL below 2s", "SessionTTL", func(c *C) { c.SessionTTL = 2*time.Second - 1 }),
		ok("SessionTTL 1m", func(c *C) { c.SessionTTL = time.Minute }),
		bad("SessionTTL not whole seconds", "SessionTTL", func(c *C) { c.SessionTTL = 2500 * time.Millisecond }),
		bad("SessionTTL above 1m", "SessionTTL", func(c *C) { c.SessionTTL = time.Minute + 1 }),
		bad("Prefix relative", "Prefix", func(c *C) { c.Prefix = "relative/" }),
		ok("ProbeInterval at the floor", func(c *C) { c.ProbeInterval = 100 * time.Millisecond }),
		bad("ProbeInterval below the floor", "ProbeInterval", func(c *C) { c.ProbeInterval = 100*time.Millisecond - 1 }),
		ok("ProbeTimeout 0 (default)", func(c *C) { c.ProbeTimeout = 0 }),
		bad("ProbeTimeout -1ns", "ProbeTimeout", func(c *C) { c.ProbeTimeout = -1 }),
		bad("ProbeConcurrency -1", "ProbeConcurrency", func(c *C) { c.ProbeConcurrency = -1 }),
		ok("RingSize 0 (default)", func(c *C) { c.RingSize = 0 }),
		bad("RingSize -1", "RingSize", func(c *C) { c.RingSize = -1 }),
		bad("QueueSize -1", "QueueSize", func(c *C) { c.QueueSize = -1 }),
		ok("ShutdownGrace 0 (default)", func(c *C) { c.ShutdownGrace = 0 }),
		bad("ShutdownGrace -1ns", "ShutdownGrace", func(c *C) { c.ShutdownGrace = -1 }),
		bad("Thresholds.Slow 0", "Thresholds.Slow", func(c *C) { c.Thresholds.Slow = 0 }),
		ok("Thresholds.FailuresToDegraded 1", func(c *C) { c.Thresholds.FailuresToDegraded = 1 }),
		bad("Thresholds.FailuresToDegraded 101", "Thresholds.FailuresToDegraded", func(c *C) { c.Thresholds.FailuresToDegraded = 101 }),
		ok("Limits zero (default)", func(c *C) { c.Limits = peerlimit.Config{} }),
		bad("Limits.WriteBurst 0", "Limits.WriteBurst", func(c *C) { c.Limits.WriteBurst = 0 }),
		ok("MaxRequestBytes at its minimum", func(c *C) { c.MaxRequestBytes = node.MinRequestBytes }),
		bad("MaxRequestBytes below its minimum", "MaxRequestBytes", func(c *C) { c.MaxRequestBytes = node.MinRequestBytes - 1 }),
		ok("MaxResponseBytes at its minimum", func(c *C) { c.MaxResponseBytes = node.MinResponseBytes }),
		bad("MaxResponseBytes below its minimum", "MaxResponseBytes", func(c *C) { c.MaxResponseBytes = node.MinResponseBytes - 1 }),
		ok("OperatorDeregister none", func(c *C) { c.OperatorDeregister = "none" }),
		bad("OperatorDeregister anyone", "OperatorDeregister", func(c *C) { c.OperatorDeregister = "anyone" }),
		ok("Embed.ClusterState existing", func(c *C) { c.Embed.ClusterState = "existing" }),
		bad("Embed.ClusterState maybe", "Embed.ClusterState", func(c *C) { c.Embed.ClusterState = "maybe" }),
		ok("DNS on loopback", func(c *C) { c.DNS.Listen = "127.0.0.1:8600" }),
		ok("DNS off: its other fields unchecked", func(c *C) { c.DNS = dnsapi.Config{} }),
		bad("DNS.Listen not host:port", "DNS.Listen", func(c *C) { c.DNS.Listen = "8600" }),
		bad("DNS.Listen port by name", "DNS.Listen", func(c *C) { c.DNS.Listen = "127.0.0.1:domain" }),
		bad("DNS.Domain the root", "DNS.Domain", func(c *C) { c.DNS.Listen, c.DNS.Domain = "127.0.0.1:0", "." }),
		bad("DNS.Domain not a name", "DNS.Domain", func(c *C) { c.DNS.Listen, c.DNS.Domain = "127.0.0.1:0", "a..b" }),
		ok("DNS.Domain without the dot", func(c *C) { c.DNS.Listen, c.DNS.Domain = "127.0.0.1:0", "Consul" }),
		bad("DNS.TTL 0", "DNS.TTL", func(c *C) { c.DNS.Listen, c.DNS.TTL = "127.0.0.1:0", 0 }),
		bad("DNS.TTL 1500ms", "DNS.TTL", func(c *C) { c.DNS.Listen, c.DNS.TTL = "127.0.0.1:0", 1500*time.Millisecond }),
		ok("DNS.TTL 1h", func(c *C) { c.DNS.Listen, c.DNS.TTL = "127.0.0.1:0", time.Hour }),
		bad("DNS.TTL above 1h", "DNS.TTL", func(c *C) { c.DNS.Listen, c.DNS.TTL = "127.0.0.1:0", time.Hour+time.Second }),
		bad("DNS.Rate 0", "DNS.Rate", func(c *C) { c.DNS.Listen, c.DNS.Rate = "127.0.0.1:0", 0 }),
		bad("DNS.Rate -1", "DNS.Rate", func(c *C) { c.DNS.Listen, c.DNS.Rate = "127.0.0.1:0", -1 }),
		bad("DNS.MaxUDPSize 511", "DNS.MaxUDPSize", func(c *C) { c.DNS.Listen, c.DNS.MaxUDPSize = "127.0.0.1:0", 511 }),
		bad("DNS.MaxSources 1", "DNS.MaxSources", func(c *C) { c.DNS.Listen, c.DNS.MaxSources = "127.0.0.1:0", 1 }),
	})
	c := node.DefaultConfig()
	c.Limits.WriteBurst = 0
	err := c.Validate()
	if !errors.Is(err, peerlimit.ErrInvalidConfig) || err.Error() != "node: Config.Limits.WriteBurst must be at least 1, got 0" {
		t.Errorf("Limits.WriteBurst 0: %v", err)
	}
}

// The advertised host of a regnode listening on every address: the
// default route's one address; else the host's one address, IPv4 first;
// none or several refuse, saying which.
func TestAdvertiseHost(t *testing.T) {
	ips := func(ss ...string) []net.IP {
		var out []net.IP
		for _, s := range ss {
			out = append(out, net.ParseIP(s))
		}
		return out
	}
	for _, tc := range []struct {
		listen string
		host   node.Host
		want   string // "" for a refusal
		says   string // in the refusal
	}{
		{"0.0.0.0", node.Host{IPs: ips("10.1.2.3")}, "10.1.2.3", ""},
		{"0.0.0.0", node.Host{IPs: ips("fe80::1", "10.1.2.3", "fd00::2")}, "10.1.2.3", ""},
		{"::", node.Host{IPs: ips("fe80::1", "10.1.2.3", "fd00::2")}, "10.1.2.3", ""},
		{"::", node.Host{IPs: ips("fe80::1", "fd00::2")}, "fd00::2", ""},
		{"", node.Host{IPs: ips("fd00::2")}, "fd00::2", ""},
		// a bridge beside the default route's interface
		{"0.0.0.0", node.Host{IPs: ips("192.168.1.5", "172.17.0.1"), Routed: ips("192.168.1.5", "fe80::1")}, "192.168.1.5", ""},
		{"::", node.Host{IPs: ips("192.168.1.5", "172.17.0.1"), Routed: ips("192.168.1.5")}, "192.168.1.5", ""},
		{"0.0.0.0", node.Host{IPs: ips("fd00::2")}, "", "no address"},
		{"0.0.0.0", node.Host{IPs: ips("fe80::1", "169.254.0.9")}, "", "no address"},
		{"0.0.0.0", node.Host{}, "", "no address"},
		{"0.0.0.0", node.Host{IPs: ips("10.1.2.3", "172.17.0.1")}, "", "several addresses (10.1.2.3, 172.17.0.1)"},
		// two on the default route's interface do not settle it
		{"0.0.0.0", node.Host{IPs: ips("10.1.2.3", "10.1.2.4"), Routed: ips("10.1.2.3", "10.1.2.4")}, "", "several addresses (10.1.2.3, 10.1.2.4)"},
		{"::", node.Host{IPs: ips("fd00::2", "fd00::3")}, "", "several addresses (fd00::2, fd00::3)"},
	} {
		got, err := node.AdvertiseHost(tc.listen, tc.host)
		if tc.want != "" {
			if err != nil || got != tc.want {
				t.Errorf("AdvertiseHost(%q, %v) = %q, %v; want %q", tc.listen, tc.host, got, err, tc.want)
			}
			continue
		}
		if err == nil || !strings.Contains(err.Error(), tc.says) {
			t.Errorf("AdvertiseHost(%q, %v) = %q, %v; want a refusal saying %q", tc.listen, tc.host, got, err, tc.says)
		}
	}
}

// This host's default route, as the default reads it from Linux's
// /proc/net/route: the interface it names is one of the host's.
func TestDefaultRouteInterface(t *testing.T) {
	b, err := os.ReadFile("/proc/net/route")
	if err != nil {
		t.Skipf("no /proc/net/route: %v", err)
	}
	var want string
	for _, l := range strings.Split(string(b), "\n")[1:] {
		if fs := strings.Fields(l); len(fs) >= 8 && fs[1] == "00000000" && fs[7] == "00000000" {
			want = fs[0] // the first; a host with several default routes is not this test's
			break
		}
	}
	if got := node.DefaultRouteInterface(); got != want {
		t.Fatalf("DefaultRouteInterface() = %q; /proc/net/route says %q", got, want)
	}
	if want == "" {
		return
	}
	ifc, err := net.InterfaceByName(want)
	if err != nil {
		t.Fatalf("the default route's interface %q: %v", want, err)
	}
	addrs, err := ifc.Addrs()
	if err != nil {
		t.Fatal(err)
	}
	h, err := node.ReadHost()
	if err != nil {
		t.Fatal(err)
	}
	if len(h.Routed) != len(addrs) || len(h.IPs) < len(h.Routed) {
		t.Fatalf("ReadHost: %v; want the %d addresses of %s (%v) as routed, among all", h, len(addrs), want, addrs)
	}
}

// A regnode listening on every address advertises the host's one address
// by default; a host with several refuses, naming the field (the flag, in
// cmd/regnode) and the addresses; an AdvertiseAddress settles it.
func TestValidateAdvertiseDefault(t *testing.T) {
	c := node.DefaultConfig()
	c.Listen, c.Insecure = "0.0.0.0:7400", true
	defer node.SetHost(nil, "192.0.2.7", "fe80::1")()
	if err := c.Validate(); err != nil {
		t.Fatalf("one address: %v", err)
	}
	defer node.SetHost([]string{"192.0.2.7"}, "192.0.2.7", "172.17.0.1")()
	if err := c.Validate(); err != nil {
		t.Fatalf("one address on the default route: %v", err)
	}
	defer node.SetHost(nil, "192.0.2.7", "172.17.0.1")()
	err := c.Validate()
	want := "node: Config.AdvertiseAddress must be set to the HOST:PORT other regnodes dial: --listen 0.0.0.0:7400 is every address of this host, " +
		"and this host has several addresses (192.0.2.7, 172.17.0.1) and no one default route's address to choose"
	if !errors.Is(err, node.ErrInvalidConfig) || err.Error() != want {
		t.Fatalf("several addresses: %v\nwant %s", err, want)
	}
	c.Listen = "[::]:7400"
	if err := c.Validate(); err == nil {
		t.Fatal("several addresses, listening on ::: accepted")
	}
	c.AdvertiseAddress = "192.0.2.7:7400"
	if err := c.Validate(); err != nil {
		t.Fatalf("several addresses and an AdvertiseAddress: %v", err)
	}
	c.AdvertiseAddress, c.Listen = "", "127.0.0.1:7400"
	if err := c.Validate(); err != nil {
		t.Fatalf("several addresses, listening on loopback: %v", err)
	}
}

// The address announced: AdvertiseAddress; else the listener as bound, its
// unspecified host (Go binds 0.0.0.0 as [::]) replaced by the host's
// address, with the port bound.
func TestAdvertiseFor(t *testing.T) {
	defer node.SetHost([]string{"192.0.2.7"}, "192.0.2.7", "fd00::7", "172.17.0.1")()
	for _, tc := range []struct{ advertise, bound, want string }{
		{"regnode-0.peers.ns.svc:7400", "[::]:7400", "regnode-0.peers.ns.svc:7400"},
		{"", "127.0.0.1:41234", "127.0.0.1:41234"},
		{"", "[::]:41234", "192.0.2.7:41234"},
		{"", "0.0.0.0:7400", "192.0.2.7:7400"},
	} {
		if got, err := node.AdvertiseFor(tc.advertise, tc.bound); err != nil || got != tc.want {
			t.Errorf("AdvertiseFor(%q, %q) = %q, %v; want %q", tc.advertise, tc.bound, got, err, tc.want)
		}
	}
	defer node.SetHost(nil, "192.0.2.7", "192.0.2.8")()
	if got, err := node.AdvertiseFor("", "[::]:7400"); err == nil || !strings.Contains(err.Error(), "set --advertise-address") {
		t.Errorf("several addresses: %q, %v; want a refusal naming --advertise-address", got, err)
	}
}
