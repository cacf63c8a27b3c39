package dnsapi

import (
	"fmt"
	"slices"
	"testing"

	"github.com/miekg/dns"

	"github.com/regcluster/registry/cache"
	registryv1 "github.com/regcluster/registry/proto/registry/v1"
)

var (
	serving  = registryv1.Lifecycle_LIFECYCLE_SERVING
	draining = registryv1.Lifecycle_LIFECYCLE_DRAINING
	healthy  = &registryv1.Health{State: registryv1.HealthState_HEALTH_STATE_HEALTHY}
	degraded = &registryv1.Health{State: registryv1.HealthState_HEALTH_STATE_DEGRADED}
	down     = &registryv1.Health{State: registryv1.HealthState_HEALTH_STATE_UNAVAILABLE}
	tcpCheck = &registryv1.HealthCheck{Kind: registryv1.CheckKind_CHECK_KIND_TCP}
)

// testServer is a Server over a cache holding instances, never listening.
func testServer(t testing.TB, instances ...*registryv1.Instance) *Server {
	t.Helper()
	c := cache.New()
	if _, err := c.Apply(cache.Batch{Revision: 7, Snapshot: true, Instances: instances}); err != nil {
		t.Fatal(err)
	}
	cfg := DefaultConfig()
	cfg.Listen, cfg.View = "127.0.0.1:0", c.Snapshot
	s, err := New(cfg)
	if err != nil {
		t.Fatal(err)
	}
	return s
}

func query(s *Server, name string, qtype uint16) *dns.Msg {
	req := new(dns.Msg).SetQuestion(name, qtype)
	m, _ := s.reply(req, MaxTCPBytes)
	return m
}

// What each name answers, from a view of the cases that matter: dotted
// service names, zones, a host name address, instances that are not
// routable, two instances at one address.
func TestNames(t *testing.T) {
	s := testServer(t,
		&registryv1.Instance{Service: "web", Id: "a", Address: "10.0.0.1:80", Zone: "EU-1", Weight: 300, Lifecycle: serving},
		&registryv1.Instance{Service: "web", Id: "b", Address: "[fd00::2]:81", Zone: "us", Lifecycle: serving, Health: degraded, Weight: 100, Check: tcpCheck},
		&registryv1.Instance{Service: "web", Id: "c", Address: "host.example:82", Zone: "us", Lifecycle: serving},
		&registryv1.Instance{Service: "web", Id: "d", Address: "10.0.0.4:80", Zone: "us", Lifecycle: draining},
		&registryv1.Instance{Service: "web", Id: "e", Address: "10.0.0.5:80", Zone: "ap", Lifecycle: serving, Health: down, Check: tcpCheck},
		&registryv1.Instance{Service: "web", Id: "f", Address: "10.0.0.6:80", Zone: "ap", Lifecycle: serving, Check: tcpCheck}, // never probed
		&registryv1.Instance{Service: "web", Id: "g", Address: "10.0.0.1:80", Zone: "EU-1", Weight: 5, Lifecycle: serving, Health: healthy},
		&registryv1.Instance{Service: "a.b", Id: "x", Address: "10.1.0.1:90", Zone: "z", Lifecycle: serving},
		&registryv1.Instance{Service: "b", Id: "y", Address: "10.2.0.1:91", Lifecycle: serving},
	)
	for _, tc := range []struct {
		name  string
		qtype uint16
		rcode int
		want  []string // the answer's records, sorted, in presentation form without the header
	}{
		{"web.service.registry.", dns.TypeA, dns.RcodeSuccess, []string{"10.0.0.1"}},
		{"WEB.Service.Registry.", dns.TypeA, dns.RcodeSuccess, []string{"10.0.0.1"}},
		{"web.service.registry.", dns.TypeAAAA, dns.RcodeSuccess, []string{"fd00::2"}},
		{"_web._tcp.service.registry.", dns.TypeSRV, dns.RcodeSuccess, []string{
			"0 25 81 fd000000000000000000000000000002.addr.registry.", "0 305 80 0a000001.addr.registry.", "0 100 82 host.example."}},
		{"web.service.registry.", dns.TypeSRV, dns.RcodeSuccess, []string{
			"0 25 81 fd000000000000000000000000000002.addr.registry.", "0 305 80 0a000001.addr.registry.", "0 100 82 host.example."}},
		{"eu-1.web.service.registry.", dns.TypeA, dns.RcodeSuccess, []string{"10.0.0.1"}},
		{"us.web.service.registry.", dns.TypeA, dns.RcodeSuccess, nil},
		{"_web._tcp.us.service.registry.", dns.TypeSRV, dns.RcodeSuccess, []string{
			"0 25 81 fd000000000000000000000000000002.addr.registry.", "0 100 82 host.example."}},
		{"ap.web.service.registry.", dns.TypeA, dns.RcodeSuccess, nil}, // known zone, nothing routable
		{"mars.web.service.registry.", dns.TypeA, dns.RcodeNameError, nil},
		{"_web._tcp.mars.service.registry.", dns.TypeSRV, dns.RcodeNameError, nil},
		{"nope.service.registry.", dns.TypeA, dns.RcodeNameError, nil},
		{"_nope._tcp.service.registry.", dns.TypeSRV, dns.RcodeNameError, nil},
		{"_web._udp.service.registry.", dns.TypeSRV, dns.RcodeNameError, nil},
		{"a.b.service.registry.", dns.TypeA, dns.RcodeSuccess, []string{"10.1.0.1"}}, // the service a.b, not zone a of b
		{"z.a.b.service.registry.", dns.TypeA, dns.RcodeSuccess, []string{"10.1.0.1"}},
		{"_a.b._tcp.service.registry.", dns.TypeSRV, dns.RcodeSuccess, []string{"0 100 90 0a010001.addr.registry."}},
		{"b.service.registry.", dns.TypeA, dns.RcodeSuccess, []string{"10.2.0.1"}},
		{"0a000001.addr.registry.", dns.TypeA, dns.RcodeSuccess, []string{"10.0.0.1"}},
		{"0a000001.addr.registry.", dns.TypeAAAA, dns.RcodeSuccess, nil},
		{"fd000000000000000000000000000002.addr.registry.", dns.TypeAAAA, dns.RcodeSuccess, []string{"fd00::2"}},
		{"0a0000.addr.registry.", dns.TypeA, dns.RcodeNameError, nil},
		{"zz000001.addr.registry.", dns.TypeA, dns.RcodeNameError, nil},
		{"registry.", dns.TypeSOA, dns.RcodeSuccess, []string{"ns.registry. hostmaster.registry. 7 3600 600 86400 5"}},
		{"service.registry.", dns.TypeA, dns.RcodeSuccess, nil},
		{"other.registry.", dns.TypeA, dns.RcodeNameError, nil},
		{"web.service.registry.", dns.TypeTXT, dns.RcodeSuccess, nil},
		{"example.com.", dns.TypeA, dns.RcodeRefused, nil},
	} {
		m := query(s, tc.name, tc.qtype)
		var got []string
		for _, rr := range m.Answer {
			got = append(got, rrData(rr))
			if rr.Header().Ttl != 5 || rr.Header().Name != tc.name && tc.qtype != dns.TypeSOA {
				t.Errorf("%s %s: %v: TTL or owner name wrong", tc.name, dns.TypeToString[tc.qtype], rr)
			}
		}
		slices.Sort(got)
		want := slices.Clone(tc.want)
		slices.Sort(want)
		if m.Rcode != tc.rcode || !slices.Equal(got, want) {
			t.Errorf("%s %s: %s %q, want %s %q", tc.name, dns.TypeToString[tc.qtype],
				dns.RcodeToString[m.Rcode], got, dns.RcodeToString[tc.rcode], want)
		}
		negative := len(m.Answer) == 0 && tc.rcode != dns.RcodeRefused
		if hasSOA := len(m.Ns) == 1 && m.Ns[0].Header().Rrtype == dns.TypeSOA; negative != hasSOA {
			t.Errorf("%s %s: authority %v; want the SOA exactly when there is no answer", tc.name, dns.TypeToString[tc.qtype], m.Ns)
		}
		if m.Authoritative != (tc.rcode != dns.RcodeRefused) {
			t.Errorf("%s: AA %v", tc.name, m.Authoritative)
		}
	}
	// An SRV answer's IP targets are in the additional section.
	m := query(s, "_web._tcp.service.registry.", dns.TypeSRV)
	var extra []string
	for _, rr := range m.Extra {
		extra = append(extra, rr.Header().Name+" "+rrData(rr))
	}
	slices.Sort(extra)
	if want := []string{"0a000001.addr.registry. 10.0.0.1", "fd000000000000000000000000000002.addr.registry. fd00::2"}; !slices.Equal(extra, want) {
		t.Errorf("SRV additional section %q, want %q", extra, want)
	}
}

func rrData(rr dns.RR) string {
	h := rr.Header().String()
	return rr.String()[len(h):]
}

// Until the view is complete every query inside the domain is SERVFAIL.
func TestNotReady(t *testing.T) {
	s := testServer(t, &registryv1.Instance{Service: "web", Id: "a", Address: "10.0.0.1:80", Lifecycle: serving})
	ready := make(chan struct{})
	s.cfg.Ready = ready
	if m := query(s, "web.service.registry.", dns.TypeA); m.Rcode != dns.RcodeServerFailure || len(m.Answer) != 0 {
		t.Fatalf("before ready: %v", m)
	}
	close(ready)
	if m := query(s, "web.service.registry.", dns.TypeA); m.Rcode != dns.RcodeSuccess || len(m.Answer) != 1 {
		t.Fatalf("after ready: %v", m)
	}
}

// Answers come in a fresh order: over many queries each instance of
// eight comes first at least once.
func TestShuffled(t *testing.T) {
	var ins []*registryv1.Instance
	for i := range 8 {
		ins = append(ins, &registryv1.Instance{Service: "web", Id: fmt.Sprint(i), Address: fmt.Sprintf("10.0.0.%d:80", i+1), Lifecycle: serving})
	}
	s := testServer(t, ins...)
	first := map[string]bool{}
	for range 400 {
		first[rrData(query(s, "web.service.registry.", dns.TypeA).Answer[0])] = true
	}
	if len(first) != 8 {
		t.Fatalf("only %d of 8 addresses ever came first: %v", len(first), first)
	}
}

// EDNS: the OPT record is echoed; a version other than 0 is BADVERS.
func TestEDNS(t *testing.T) {
	s := testServer(t, &registryv1.Instance{Service: "web", Id: "a", Address: "10.0.0.1:80", Lifecycle: serving})
	req := new(dns.Msg).SetQuestion("web.service.registry.", dns.TypeA).SetEdns0(1232, false)
	m, _ := s.reply(req, 1232)
	if opt := m.IsEdns0(); opt == nil || opt.UDPSize() != 4096 || len(m.Answer) != 1 {
		t.Fatalf("EDNS reply %v", m)
	}
	req.IsEdns0().SetVersion(1)
	m, result := s.reply(req, 1232)
	if m.Rcode != dns.RcodeBadVers || result != ResultBadVers || m.IsEdns0() == nil {
		t.Fatalf("EDNS version 1: %v (%s)", m, result)
	}
	if _, err := m.Pack(); err != nil {
		t.Fatalf("BADVERS reply does not pack: %v", err)
	}
}

// An answer larger than the TCP bound keeps what fits in MaxTCPBytes and
// sets TC; one whose additional records alone do not fit is whole and
// does not.
func TestTCPBound(t *testing.T) {
	var ins []*registryv1.Instance
	for i := range 2500 {
		ins = append(ins, &registryv1.Instance{Service: "huge", Id: fmt.Sprint(i),
			Address: fmt.Sprintf("[fd00::%x]:%d", i+1, 1000+i), Lifecycle: serving})
		if i < 800 {
			ins = append(ins, &registryv1.Instance{Service: "big", Id: fmt.Sprint(i),
				Address: fmt.Sprintf("[fd00::%x]:%d", i+1, 1000+i), Lifecycle: serving})
		}
	}
	s := testServer(t, ins...)
	for _, tc := range []struct {
		service   string
		answers   int // 0: some, not all
		truncated bool
	}{{"huge", 0, true}, {"big", 800, false}} {
		m, result := s.reply(new(dns.Msg).SetQuestion("_"+tc.service+"._tcp.service.registry.", dns.TypeSRV), MaxTCPBytes)
		b, err := m.Pack()
		if err != nil {
			t.Fatal(err)
		}
		if len(b) > MaxTCPBytes || len(b) < MaxTCPBytes-100 || m.Truncated != tc.truncated || (result == ResultTruncated) != tc.truncated ||
			tc.answers == 0 && len(m.Answer) >= 2500 || tc.answers != 0 && (len(m.Answer) != tc.answers || len(m.Extra) >= tc.answers) {
			t.Errorf("%s: %d bytes, %d answers, %d additional, TC %v (%s)", tc.service, len(b), len(m.Answer), len(m.Extra), m.Truncated, result)
		}
	}
}
