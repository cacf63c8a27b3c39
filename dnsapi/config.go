package dnsapi

import (
	"errors"
	"log/slog"
	"net"
	"strconv"
	"strings"
	"time"

	"github.com/miekg/dns"

	"github.com/regcluster/registry/cache"
	"github.com/regcluster/registry/internal/configerr"
)

// ErrInvalidConfig is wrapped by every error of Config.Validate, and so of
// New (see package configerr).
var ErrInvalidConfig = errors.New("dnsapi: invalid config")

// Limits of the settings and of the replies.
const (
	// MaxTCPBytes bounds a reply over TCP, well under the 65,535 bytes a
	// DNS message over TCP can hold: past it records are left out and TC
	// is set.
	MaxTCPBytes = 60000
	// MaxTTL is the longest TTL Validate accepts: a resolver that caches
	// an answer longer sends callers to instances long gone.
	MaxTTL = time.Hour
)

// Config configures a Server. DefaultConfig sets every field but Listen
// and View; Validate refuses a zero TTL, Rate, MaxSources or MaxUDPSize
// instead of filling a default, so that a flag set to 0 is an error, not a
// silent default: start from DefaultConfig.
type Config struct {
	// Listen is the address served over UDP and TCP alike, host:port
	// (required; port 0 picks a port free for both).
	Listen string
	// Domain is the zone served, as a fully qualified name (default
	// "registry."; a missing trailing dot is added, letters are folded to
	// lower case).
	Domain string
	// TTL of every record, and the negative-caching TTL of the SOA (default
	// 5s; whole seconds within 1s..MaxTTL). It is how long a resolver may
	// keep sending callers to an instance the registry already took out of
	// rotation.
	TTL time.Duration
	// Rate is the queries per second each source IP address may make;
	// queries past it are dropped (UDP) or end the connection (TCP)
	// (default 5000; > 0).
	Rate float64
	// Burst is the queries a source may make at once before Rate applies
	// (0: Rate rounded up, one second's worth).
	Burst int
	// MaxSources bounds the sources whose rate is tracked (default
	// 65536, at least 2). When it is reached the least recently seen half
	// is forgotten: memory stays bounded whatever addresses a spoofer
	// sends from, at the cost of forgotten sources starting again with a
	// full burst.
	MaxSources int
	// MaxUDPSize caps a reply over UDP to an EDNS0 query, whatever buffer
	// size the query advertises (default 4096; 512..65535). It is also
	// the size this server advertises in its own OPT record. A query
	// without EDNS0 gets 512 bytes at most.
	MaxUDPSize int
	// View returns the registry as this regnode holds it in memory
	// (required by New; typically a fan-out hub's Cache().Snapshot). No
	// query reads etcd.
	View func() *cache.Snapshot
	// Ready, if not nil, is closed once View holds a complete view;
	// until then every query inside Domain is answered SERVFAIL (not an
	// NXDOMAIN a resolver would cache).
	Ready <-chan struct{}
	// Logger (default slog.Default()).
	Logger *slog.Logger
	// OnQuery, if set, is called once per query with its result (one of
	// Results), for metrics.
	OnQuery func(result string)
}

// DefaultConfig is a Config with every default set; Listen and View are
// left for the caller.
func DefaultConfig() Config {
	return Config{
		Domain:     "registry.",
		TTL:        5 * time.Second,
		Rate:       5000,
		MaxSources: 65536,
		MaxUDPSize: 4096,
	}
}

// Validate reports the first setting that cannot work, as a
// *configerr.Error naming the field and wrapping ErrInvalidConfig. It does
// not require View (New does), so a regnode can check its flags before it
// has a view to serve.
func (c Config) Validate() error {
	if err := validListen(c.Listen); err != nil {
		return invalid("Listen", c.Listen, err.Error())
	}
	if _, err := canonicalDomain(c.Domain); err != nil {
		return invalid("Domain", c.Domain, err.Error())
	}
	if c.TTL < time.Second || c.TTL > MaxTTL || c.TTL%time.Second != 0 {
		return invalid("TTL", c.TTL, "must be whole seconds within 1s.."+MaxTTL.String())
	}
	if !(c.Rate > 0) || c.Rate > 1e9 {
		return invalid("Rate", c.Rate, "must be > 0 queries per second (and at most 1e9)")
	}
	if c.Burst < 0 {
		return invalid("Burst", c.Burst, "must be >= 0 (0: Rate rounded up)")
	}
	if c.MaxSources < 2 {
		return invalid("MaxSources", c.MaxSources, "must be at least 2")
	}
	if c.MaxUDPSize < dns.MinMsgSize || c.MaxUDPSize > dns.MaxMsgSize {
		return invalid("MaxUDPSize", c.MaxUDPSize, "must be within 512..65535")
	}
	return nil
}

func invalid(field string, v any, rule string) error {
	return configerr.New(ErrInvalidConfig, "dnsapi", field, v, rule)
}

// validListen checks host:port with a numeric port 0..65535.
func validListen(addr string) error {
	_, port, err := net.SplitHostPort(addr)
	if err != nil {
		return errors.New("must be host:port")
	}
	if p, err := strconv.ParseUint(port, 10, 16); err != nil || strconv.FormatUint(p, 10) != port {
		return errors.New("must be host:port with a port of 0..65535")
	}
	return nil
}

// canonicalDomain is d as a lower-case fully qualified name, or why it is
// not a domain name this server can serve.
func canonicalDomain(d string) (string, error) {
	if d == "" || d == "." {
		return "", errors.New("must be a domain name other than the root")
	}
	d = dns.Fqdn(strings.ToLower(d))
	if _, ok := dns.IsDomainName(d); !ok || strings.ContainsAny(d, `\ `) {
		return "", errors.New("must be a domain name of letters, digits, '-' and '_' labels")
	}
	for _, l := range dns.SplitDomainName(d) {
		for i := 0; i < len(l); i++ {
			ch := l[i]
			if !(ch >= 'a' && ch <= 'z' || ch >= '0' && ch <= '9' || ch == '-' || ch == '_') {
				return "", errors.New("must be a domain name of letters, digits, '-' and '_' labels")
			}
		}
	}
	return d, nil
}
