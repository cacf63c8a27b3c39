package dnsapi_test

import (
	"context"
	"errors"
	"fmt"
	"net"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/miekg/dns"
	"google.golang.org/protobuf/types/known/durationpb"

	"github.com/regcluster/registry/dnsapi"
	registryv1 "github.com/regcluster/registry/proto/registry/v1"
)

// A service of three instances with weights, asked through Go's resolver
// and dig: A and SRV hold all three (SRV weights as registered, targets
// that resolve); an instance drained, then one whose health check starts
// failing (UNAVAILABLE), leave the answers.
func TestServiceThroughResolverAndDig(t *testing.T) {
	r := startRegnode(t, nil)
	ctx := context.Background()
	// c's check dials its own address: a listener the test closes later.
	lis, err := net.Listen("tcp", "127.0.0.4:0")
	if err != nil {
		t.Fatal(err)
	}
	defer lis.Close()
	go func() {
		for {
			c, err := lis.Accept()
			if err != nil {
				return
			}
			c.Close()
		}
	}()
	cPort := lis.Addr().(*net.TCPAddr).Port
	r.register(t, &registryv1.Instance{Service: "orders", Id: "a", Address: "127.0.0.2:8080", Weight: 100})
	r.register(t, &registryv1.Instance{Service: "orders", Id: "b", Address: "127.0.0.3:8081", Weight: 300})
	r.register(t, &registryv1.Instance{Service: "orders", Id: "c", Address: fmt.Sprintf("127.0.0.4:%d", cPort), Weight: 600,
		Check: &registryv1.HealthCheck{Kind: registryv1.CheckKind_CHECK_KIND_TCP, Interval: durationpb.New(200 * time.Millisecond),
			Timeout: durationpb.New(200 * time.Millisecond), FailuresToDegraded: 1, FailuresToUnavailable: 1}})
	// c is routable once its first probe succeeds.
	r.waitAddresses(t, "orders.service.registry.", "127.0.0.2", "127.0.0.3", "127.0.0.4")

	res := r.resolver()
	hosts, err := res.LookupHost(ctx, "orders.service.registry.")
	slices.Sort(hosts)
	if err != nil || !slices.Equal(hosts, []string{"127.0.0.2", "127.0.0.3", "127.0.0.4"}) {
		t.Fatalf("LookupHost = %v, %v", hosts, err)
	}
	cname, srvs, err := res.LookupSRV(ctx, "orders", "tcp", "service.registry.")
	if err != nil || cname != "_orders._tcp.service.registry." {
		t.Fatalf("LookupSRV = %q, %v", cname, err)
	}
	want := map[string]string{ // target -> port/weight
		"7f000002.addr.registry.": "8080/100", "7f000003.addr.registry.": "8081/300",
		"7f000004.addr.registry.": fmt.Sprintf("%d/600", cPort)}
	got := map[string]string{}
	for _, s := range srvs {
		got[s.Target] = fmt.Sprintf("%d/%d", s.Port, s.Weight)
		if s.Priority != 0 {
			t.Errorf("SRV %v: priority %d", s, s.Priority)
		}
		// Each target resolves on its own.
		addrs, err := res.LookupHost(ctx, s.Target)
		if want := "127.0.0." + s.Target[7:8]; err != nil || len(addrs) != 1 || addrs[0] != want {
			t.Errorf("target %s resolves to %v, %v", s.Target, addrs, err)
		}
	}
	if fmt.Sprint(got) != fmt.Sprint(want) {
		t.Fatalf("SRV records %v, want %v", got, want)
	}

	// dig: A, then SRV with the targets' addresses in the additional section.
	out := r.dig(t, "orders.service.registry.", "A")
	var digAddrs []string
	for _, row := range digAnswers(out) {
		if row[1] != "5" || row[2] != "A" {
			t.Errorf("dig: %v, want TTL 5 and type A", row)
		}
		digAddrs = append(digAddrs, row[3])
	}
	slices.Sort(digAddrs)
	if status, flags, _ := digHeader(t, out); status != "NOERROR" || !slices.Contains(flags, "aa") ||
		!slices.Equal(digAddrs, []string{"127.0.0.2", "127.0.0.3", "127.0.0.4"}) {
		t.Fatalf("dig A: %s %v %v\n%s", status, flags, digAddrs, out)
	}
	out = r.dig(t, "_orders._tcp.service.registry.", "SRV")
	var digSRV []string
	for _, row := range digAnswers(out) {
		digSRV = append(digSRV, row[3])
	}
	slices.Sort(digSRV)
	wantSRV := []string{"0 100 8080 7f000002.addr.registry.", "0 300 8081 7f000003.addr.registry.",
		fmt.Sprintf("0 600 %d 7f000004.addr.registry.", cPort)}
	if !slices.Equal(digSRV, wantSRV) || !strings.Contains(out, "ADDITIONAL: 4") ||
		!matches(out, `(?m)^7f000003\.addr\.registry\.\s+5\s+IN\s+A\s+127\.0\.0\.3$`) {
		t.Fatalf("dig SRV: %q, want %q and the targets' A records\n%s", digSRV, wantSRV, out)
	}

	// Drained: b leaves A and SRV.
	if _, err := r.reg.Drain(ctx, &registryv1.DrainRequest{Service: "orders", Id: "b", Reason: "test"}); err != nil {
		t.Fatal(err)
	}
	r.waitAddresses(t, "orders.service.registry.", "127.0.0.2", "127.0.0.4")
	if m := r.ask(t, "_orders._tcp.service.registry.", dns.TypeSRV); len(m.Answer) != 2 || strings.Contains(fmt.Sprint(m.Answer), "7f000003") {
		t.Fatalf("SRV after the drain: %v", m.Answer)
	}

	// c's check fails: UNAVAILABLE, gone.
	lis.Close()
	r.waitAddresses(t, "orders.service.registry.", "127.0.0.2")
	g, err := r.reg.Get(ctx, &registryv1.GetRequest{Service: "orders", Id: "c"})
	if err != nil || g.Instance.GetHealth().GetState() != registryv1.HealthState_HEALTH_STATE_UNAVAILABLE {
		t.Fatalf("c: %v, %v; want UNAVAILABLE", g, err)
	}
	out = r.dig(t, "_orders._tcp.service.registry.", "SRV")
	if rows := digAnswers(out); len(rows) != 1 || !strings.HasSuffix(rows[0][3], "8080 7f000002.addr.registry.") {
		t.Fatalf("dig SRV after drain and failure: %v\n%s", rows, out)
	}
}

// An unknown service is NXDOMAIN, a known one with nothing routable is
// NOERROR without an answer; both carry the SOA, with the TTL as its
// minimum. Go's resolver reports both as not found.
func TestNegativeAnswers(t *testing.T) {
	r := startRegnode(t, func(c *dnsapi.Config) { c.TTL = 7 * time.Second })
	ctx := context.Background()
	r.register(t, &registryv1.Instance{Service: "idle", Id: "a", Address: "10.0.0.1:80", Lifecycle: registryv1.Lifecycle_LIFECYCLE_DRAINING})
	for _, tc := range []struct {
		name, status string
		rcode        int
	}{
		{"nope.service.registry.", "NXDOMAIN", dns.RcodeNameError},
		{"_nope._tcp.service.registry.", "NXDOMAIN", dns.RcodeNameError},
		{"idle.service.registry.", "NOERROR", dns.RcodeSuccess},
		{"_idle._tcp.service.registry.", "NOERROR", dns.RcodeSuccess},
	} {
		for _, network := range []string{"udp", "tcp"} {
			m := r.exchange(t, network, new(dns.Msg).SetQuestion(tc.name, dns.TypeSRV))
			soa, ok := soaOf(m)
			if m.Rcode != tc.rcode || len(m.Answer) != 0 || !ok || soa.Minttl != 7 || soa.Hdr.Ttl != 7 || soa.Hdr.Name != "registry." {
				t.Errorf("%s over %s: %v", tc.name, network, m)
			}
		}
		status, flags, _ := digHeader(t, r.dig(t, tc.name, "A"))
		if status != tc.status || !slices.Contains(flags, "aa") {
			t.Errorf("dig %s: %s %v, want %s", tc.name, status, flags, tc.status)
		}
		_, err := r.resolver().LookupHost(ctx, tc.name)
		var de *net.DNSError
		if !errors.As(err, &de) || !de.IsNotFound {
			t.Errorf("LookupHost(%s) = %v, want not found", tc.name, err)
		}
	}
	if n := r.metric(t, "nxdomain"); n < 4 {
		t.Errorf("registry_dns_queries_total{result=nxdomain} = %d, want at least 4", n)
	}
}

func soaOf(m *dns.Msg) (*dns.SOA, bool) {
	if len(m.Ns) != 1 {
		return nil, false
	}
	soa, ok := m.Ns[0].(*dns.SOA)
	return soa, ok
}
