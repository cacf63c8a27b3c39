package dnsapi

import (
	"encoding/hex"
	"math/rand/v2"
	"net"
	"net/netip"
	"strconv"
	"strings"

	"github.com/miekg/dns"

	"github.com/regcluster/registry/cache"
	registryv1 "github.com/regcluster/registry/proto/registry/v1"
	"github.com/regcluster/registry/record"
)

// Results are the results a query is counted under (Config.OnQuery).
var Results = []string{
	ResultAnswer, ResultTruncated, ResultNoData, ResultNXDomain, ResultRefused,
	ResultServFail, ResultFormErr, ResultNotImp, ResultBadVers, ResultMalformed, ResultRateLimited,
}

// The results of a query.
const (
	// ResultAnswer: NOERROR with every record that answers it.
	ResultAnswer = "answer"
	// ResultTruncated: NOERROR with TC set: some records did not fit.
	ResultTruncated = "truncated"
	// ResultNoData: NOERROR without an answer (a known name, nothing
	// routable or no record of the type asked), SOA in authority.
	ResultNoData = "nodata"
	// ResultNXDomain: no such name (an unknown service or zone), SOA in
	// authority.
	ResultNXDomain = "nxdomain"
	// ResultRefused: a name outside Domain, or a class other than IN.
	ResultRefused = "refused"
	// ResultServFail: the in-memory view is not complete yet.
	ResultServFail = "servfail"
	// ResultFormErr: not exactly one question, or sections a query does
	// not have.
	ResultFormErr = "formerr"
	// ResultNotImp: an opcode other than QUERY.
	ResultNotImp = "notimp"
	// ResultBadVers: an EDNS version other than 0.
	ResultBadVers = "badvers"
	// ResultMalformed: a packet that does not decode as a DNS query,
	// dropped without an answer.
	ResultMalformed = "malformed"
	// ResultRateLimited: a query past its source's rate, dropped.
	ResultRateLimited = "ratelimited"
)

// Labels of the names under Domain.
const (
	serviceLabel = "service"
	addrLabel    = "addr"
	tcpLabel     = "_tcp"
)

// reply builds the answer to req, a decoded query, for a reply of at most
// size bytes, and says how to count it. It reads only the in-memory view.
func (s *Server) reply(req *dns.Msg, size int) (*dns.Msg, string) {
	m := new(dns.Msg)
	m.SetReply(req)
	if opt := req.IsEdns0(); opt != nil {
		m.SetEdns0(uint16(s.cfg.MaxUDPSize), false)
		if opt.Version() != 0 {
			m.Rcode = dns.RcodeBadVers
			return m, ResultBadVers
		}
	}
	if req.Opcode != dns.OpcodeQuery {
		m.Rcode = dns.RcodeNotImplemented
		return m, ResultNotImp
	}
	if len(req.Question) != 1 {
		m.Rcode = dns.RcodeFormatError
		return m, ResultFormErr
	}
	q := req.Question[0]
	name := strings.ToLower(q.Name)
	if q.Qclass != dns.ClassINET || !dns.IsSubDomain(s.domain, name) {
		m.Rcode = dns.RcodeRefused
		return m, ResultRefused
	}
	if !s.ready() {
		m.Rcode = dns.RcodeServerFailure
		return m, ResultServFail
	}
	m.Authoritative = true
	snap := s.cfg.View()
	if snap == nil {
		m.Rcode = dns.RcodeServerFailure
		return m, ResultServFail
	}
	var rel []string // the labels before Domain
	if len(name) > len(s.domain) {
		rel = dns.SplitDomainName(name[:len(name)-len(s.domain)])
	}
	a := answer{s: s, q: q, m: m}
	switch n := len(rel); {
	case n == 0: // the apex
		if q.Qtype == dns.TypeSOA {
			m.Answer = append(m.Answer, s.soa(snap))
		}
	case n == 1 && (rel[0] == serviceLabel || rel[0] == addrLabel):
		// names that exist only for the names below them: no data
	case n == 2 && rel[1] == addrLabel:
		ip, ok := parseTarget(rel[0])
		if !ok {
			m.Rcode = dns.RcodeNameError
			break
		}
		a.address(q.Name, ip, false)
	case n >= 2 && rel[n-1] == serviceLabel:
		svc, zone, ok := lookup(snap, rel[:n-1])
		if !ok || !a.service(snap, svc, zone) {
			m.Rcode = dns.RcodeNameError
		}
	default:
		m.Rcode = dns.RcodeNameError
	}
	result := ResultAnswer
	switch {
	case m.Rcode == dns.RcodeNameError:
		result = ResultNXDomain
	case len(m.Answer) == 0:
		result = ResultNoData
	}
	if len(m.Answer) == 0 {
		m.Ns = append(m.Ns, s.soa(snap))
	}
	answers, authority := len(m.Answer), len(m.Ns)
	m.Truncate(size)
	if m.Truncated && len(m.Answer) == answers && len(m.Ns) == authority {
		// Only additional records were left out: the answer is whole,
		// and TC is not set for extra information (RFC 2181 §9); a
		// target without its address here is asked for on its own.
		m.Truncated = false
	}
	if m.Truncated {
		result = ResultTruncated
	}
	return m, result
}

// lookup reads the labels before "service" as [zone.]service or as
// _service._tcp[.zone]. In the first form the longest known service that
// ends the name wins, and the labels before it are the zone. A name that
// names no known service is not found.
func lookup(snap *cache.Snapshot, labels []string) (svc, zone string, ok bool) {
	if strings.HasPrefix(labels[0], "_") {
		for i := 1; i < len(labels); i++ {
			if labels[i] == tcpLabel {
				svc = strings.Join(append([]string{labels[0][1:]}, labels[1:i]...), ".")
				zone = strings.Join(labels[i+1:], ".")
				return svc, zone, svc != "" && snap.Count(svc) > 0
			}
		}
		return "", "", false
	}
	for k := range labels {
		if svc = strings.Join(labels[k:], "."); snap.Count(svc) > 0 {
			return svc, strings.Join(labels[:k], "."), true
		}
	}
	return "", "", false
}

// answer is one reply being filled.
type answer struct {
	s *Server
	q dns.Question
	m *dns.Msg
}

// endpoint is one routable instance's address.
type endpoint struct {
	ip     netip.Addr // valid when the host is an IP address
	host   string     // the host as registered
	port   uint16
	weight uint32
}

// service answers q with the routable instances of svc (in zone, when
// not empty); it reports false when zone is not a zone of svc's.
func (a *answer) service(snap *cache.Snapshot, svc, zone string) bool {
	var eps []endpoint
	zoneSeen := zone == ""
	for in := range snap.Each(svc) {
		if zone != "" && !strings.EqualFold(in.GetZone(), zone) {
			continue
		}
		zoneSeen = true
		if ep, ok := endpointOf(in); ok && record.Routable(in) {
			eps = append(eps, ep)
		}
	}
	if !zoneSeen {
		return false
	}
	rand.Shuffle(len(eps), func(i, j int) { eps[i], eps[j] = eps[j], eps[i] })
	switch a.q.Qtype {
	case dns.TypeA, dns.TypeAAAA:
		a.addresses(eps)
	case dns.TypeSRV:
		a.srv(eps)
	}
	return true
}

// endpointOf splits inst's address; false for one that does not (never for
// a record the registry validated).
func endpointOf(inst *registryv1.Instance) (endpoint, bool) {
	host, port, err := net.SplitHostPort(inst.GetAddress())
	if err != nil {
		return endpoint{}, false
	}
	p, err := strconv.ParseUint(port, 10, 16)
	if err != nil || p == 0 || host == "" {
		return endpoint{}, false
	}
	ep := endpoint{host: host, port: uint16(p), weight: record.EffectiveWeight(inst)}
	if ip, err := netip.ParseAddr(host); err == nil && ip.Zone() == "" {
		ep.ip = ip
	}
	return ep, true
}

// addresses answers A or AAAA with the IP addresses of eps, each once; a
// host name is no address and is left out.
func (a *answer) addresses(eps []endpoint) {
	seen := make(map[netip.Addr]bool, len(eps))
	for _, ep := range eps {
		if ep.ip.IsValid() && !seen[ep.ip] {
			seen[ep.ip] = true
			a.address(a.q.Name, ep.ip, false)
		}
	}
}

// address answers q, for owner name, with ip if it is of the type asked;
// with extra, into the additional section whatever the type.
func (a *answer) address(name string, ip netip.Addr, extra bool) {
	rr := a.s.addressRR(name, ip)
	switch {
	case extra:
		a.m.Extra = append(a.m.Extra, rr)
	case rr.Header().Rrtype == a.q.Qtype:
		a.m.Answer = append(a.m.Answer, rr)
	}
}

// srv answers SRV with one record per target and port, its weight the sum
// of the effective registry weights there (one instance: its weight,
// 1..1000, quartered while DEGRADED; capped at 65535); an IP target's
// address goes in the additional section.
func (a *answer) srv(eps []endpoint) {
	type key struct {
		target string
		port   uint16
	}
	at := make(map[key]*dns.SRV, len(eps))
	extra := make(map[string]bool, len(eps))
	for _, ep := range eps {
		target := dns.Fqdn(strings.ToLower(ep.host))
		if ep.ip.IsValid() {
			target = a.s.targetName(ep.ip)
		}
		k := key{target, ep.port}
		if rr := at[k]; rr != nil {
			rr.Weight = uint16(min(uint32(rr.Weight)+ep.weight, 65535))
			continue
		}
		rr := &dns.SRV{Hdr: a.s.header(a.q.Name, dns.TypeSRV), Priority: 0,
			Weight: uint16(min(ep.weight, 65535)), Port: ep.port, Target: target}
		at[k] = rr
		a.m.Answer = append(a.m.Answer, rr)
		if ep.ip.IsValid() && !extra[target] {
			extra[target] = true
			a.address(target, ep.ip, true)
		}
	}
}

// targetName is the name of ip under Domain: its bytes in hex (8 digits
// for IPv4, 32 for IPv6), then "addr": 0a000001.addr.registry.
func (s *Server) targetName(ip netip.Addr) string {
	return hex.EncodeToString(ip.AsSlice()) + "." + addrLabel + "." + s.domain
}

// parseTarget reads the first label of a target name.
func parseTarget(label string) (netip.Addr, bool) {
	if len(label) != 8 && len(label) != 32 {
		return netip.Addr{}, false
	}
	b, err := hex.DecodeString(label)
	if err != nil {
		return netip.Addr{}, false
	}
	return netip.AddrFromSlice(b)
}

// addressRR is the A (IPv4) or AAAA (IPv6) record of ip.
func (s *Server) addressRR(name string, ip netip.Addr) dns.RR {
	if ip.Is4() {
		return &dns.A{Hdr: s.header(name, dns.TypeA), A: net.IP(ip.AsSlice())}
	}
	return &dns.AAAA{Hdr: s.header(name, dns.TypeAAAA), AAAA: net.IP(ip.AsSlice())}
}

func (s *Server) header(name string, t uint16) dns.RR_Header {
	return dns.RR_Header{Name: name, Rrtype: t, Class: dns.ClassINET, Ttl: s.ttl}
}

// soa is the zone's SOA: its serial the view's revision (mod 2^32), its
// minimum (the negative-caching TTL) and TTL Config.TTL.
func (s *Server) soa(snap *cache.Snapshot) dns.RR {
	return &dns.SOA{Hdr: s.header(s.domain, dns.TypeSOA), Ns: "ns." + s.domain, Mbox: "hostmaster." + s.domain,
		Serial: uint32(snap.Revision()), Refresh: 3600, Retry: 600, Expire: 86400, Minttl: s.ttl}
}
