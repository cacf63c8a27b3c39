package node

import (
	"context"
	"fmt"
	"net"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/regcluster/registry/dnsapi"
	"github.com/regcluster/registry/internal/stopper"
)

// startDNS serves the registry over DNS on cfg.DNS.Listen, if set, from
// the fan-out's view (package dnsapi): UDP and TCP on one address, queries
// counted in registry_dns_queries_total by result.
func (n *Node) startDNS(ctx context.Context) error {
	if n.cfg.DNS.Listen == "" {
		return nil
	}
	dc := n.cfg.DNS
	dc.View, dc.Ready, dc.Logger = n.hub.Cache().Snapshot, n.hub.Ready(), n.log
	counters := make(map[string]prometheus.Counter, len(dnsapi.Results))
	for _, r := range dnsapi.Results { // every result has a series from the start
		counters[r] = n.metrics.DNSQueries.WithLabelValues(r)
	}
	dc.OnQuery = func(r string) {
		if c, ok := counters[r]; ok {
			c.Inc()
		}
	}
	srv, err := dnsapi.New(dc)
	if err != nil {
		return err
	}
	if err := n.life.Start(ctx, stopper.Component{Name: "DNS server",
		Start: func(context.Context) error { return srv.Listen() },
		Run:   srv.Serve,
		// Serve closes the sockets; this is for a start that fails before.
		Close: srv.Close}); err != nil {
		return err
	}
	n.dns = srv
	n.log.Info("DNS serving", "addr", srv.Addr(), "domain", dc.Domain, "ttl", dc.TTL, "rate_per_source", dc.Rate)
	return nil
}

// DNSAddr is where DNS is served (UDP and TCP), or "" if it is off.
func (n *Node) DNSAddr() string {
	if n.dns == nil {
		return ""
	}
	return n.dns.Addr()
}

// dnsPortFree fails if addr cannot be listened on now over UDP or TCP
// (port 0 always can).
func dnsPortFree(addr string) error {
	u, err := net.ListenPacket("udp", addr)
	if err != nil {
		return fmt.Errorf("listen for DNS on udp %s: %w", addr, err)
	}
	u.Close()
	return portFree("DNS (tcp)", addr)
}
