package dnsapi_test

import (
	"context"
	"fmt"
	"net"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/miekg/dns"
	"google.golang.org/protobuf/types/known/durationpb"

	"github.com/regcluster/registry/dnsapi"
	registryv1 "github.com/regcluster/registry/proto/registry/v1"
)

// A service of 1,000 instances: over UDP without EDNS0 the reply is at
// most 512 bytes with TC set; with dig +bufsize=4096 it is at most 4096
// bytes (more records, TC still set); over TCP every record of the answer
// fits, and SRV's additional section holds what fits in 60,000 bytes.
func TestLargeServiceTruncation(t *testing.T) {
	r := startRegnode(t, nil)
	const n = 1000
	ctx := context.Background()
	var (
		wg   sync.WaitGroup
		mu   sync.Mutex
		last int64
		errs []error
	)
	for w := range 8 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for i := w; i < n; i += 8 {
				resp, err := r.reg.Register(ctx, &registryv1.RegisterRequest{Ttl: durationpb.New(time.Hour),
					Instance: &registryv1.Instance{Service: "big", Id: fmt.Sprint(i), Address: ip(i+1) + ":9000", Weight: uint32(i%1000 + 1)}})
				mu.Lock()
				if err != nil {
					errs = append(errs, err)
				} else {
					last = max(last, resp.Revision)
				}
				mu.Unlock()
			}
		}()
	}
	wg.Wait()
	if len(errs) > 0 {
		t.Fatalf("%d registrations failed, the first: %v", len(errs), errs[0])
	}
	r.WaitRevision(t, last)

	// UDP, no EDNS0: 512 bytes at most, TC set, as many A records as fit.
	q := new(dns.Msg).SetQuestion("big.service.registry.", dns.TypeA)
	packet, err := q.Pack()
	if err != nil {
		t.Fatal(err)
	}
	b := r.raw(t, packet, 5*time.Second)
	var m dns.Msg
	if b == nil || m.Unpack(b) != nil {
		t.Fatalf("no reply over UDP (%d bytes)", len(b))
	}
	if len(b) > 512 || !m.Truncated || len(m.Answer) < 20 || m.IsEdns0() != nil {
		t.Fatalf("UDP without EDNS0: %d bytes, TC %v, %d answers, OPT %v; want at most 512 bytes, TC, some answers, no OPT",
			len(b), m.Truncated, len(m.Answer), m.IsEdns0())
	}
	udpAnswers := len(m.Answer)

	// dig +bufsize=4096, not retrying over TCP.
	out := r.dig(t, "+bufsize=4096", "+ignore", "big.service.registry.", "A")
	status, flags, size := digHeader(t, out)
	if status != "NOERROR" || !contains(flags, "tc") || size > 4096 || size < 3000 ||
		len(digAnswers(out)) <= udpAnswers || !strings.Contains(out, "; EDNS: version: 0, flags:; udp: 4096") {
		t.Fatalf("dig +bufsize=4096: %s %v, %d bytes, %d answers (UDP without EDNS0: %d)\n%.1500s",
			status, flags, size, len(digAnswers(out)), udpAnswers, out)
	}
	// dig +tcp: every record.
	out = r.dig(t, "+tcp", "big.service.registry.", "A")
	if status, flags, size := digHeader(t, out); status != "NOERROR" || contains(flags, "tc") || len(digAnswers(out)) != n || size > dnsapi.MaxTCPBytes {
		t.Fatalf("dig +tcp: %s %v, %d bytes, %d answers, want all %d", status, flags, size, len(digAnswers(out)), n)
	}

	// TCP: all 1,000 A records, and all 1,000 SRV records, with as many
	// of their targets' addresses as fit in 60,000 bytes (no TC: the
	// answer is whole; a target left out is asked for on its own).
	a := r.ask(t, "big.service.registry.", dns.TypeA)
	if len(a.Answer) != n || a.Truncated {
		t.Fatalf("A over TCP: %d answers, TC %v; want all %d", len(a.Answer), a.Truncated, n)
	}
	packet, err = new(dns.Msg).SetQuestion("_big._tcp.service.registry.", dns.TypeSRV).Pack()
	if err != nil {
		t.Fatal(err)
	}
	wire := r.rawTCP(t, packet)
	var srv dns.Msg
	if err := srv.Unpack(wire); err != nil {
		t.Fatal(err)
	}
	if len(wire) > dnsapi.MaxTCPBytes || len(wire) < dnsapi.MaxTCPBytes-100 || srv.Truncated || len(srv.Answer) != n ||
		len(srv.Extra) == 0 || len(srv.Extra) == n {
		t.Fatalf("SRV over TCP: %d bytes, TC %v, %d answers, %d additional; want every answer, as many addresses as fit under %d bytes, no TC",
			len(wire), srv.Truncated, len(srv.Answer), len(srv.Extra), dnsapi.MaxTCPBytes)
	}
	// Each address in the additional section is one an answer names.
	targets := map[string]bool{}
	for _, rr := range srv.Answer {
		targets[rr.(*dns.SRV).Target] = true
	}
	for _, rr := range srv.Extra {
		if !targets[rr.Header().Name] {
			t.Fatalf("additional record %v names no SRV target", rr)
		}
	}
	if got := r.metric(t, "truncated"); got != 2 {
		t.Fatalf("registry_dns_queries_total{result=truncated} = %d, want 2", got)
	}
}

func contains(ss []string, s string) bool {
	for _, x := range ss {
		if x == s {
			return true
		}
	}
	return false
}

// Packets that are no query are dropped without a reply and counted; the
// server answers the next query as before, over UDP and TCP.
func TestMalformedDropped(t *testing.T) {
	r := startRegnode(t, nil)
	r.register(t, &registryv1.Instance{Service: "web", Id: "a", Address: "10.0.0.1:80"})
	good, err := new(dns.Msg).SetQuestion("web.service.registry.", dns.TypeA).Pack()
	if err != nil {
		t.Fatal(err)
	}
	response := append([]byte(nil), good...)
	response[2] |= 0x80 // QR: a response, which no server answers
	junk := [][]byte{
		{0x12},
		[]byte("hello, this is not DNS at all"),
		append(append([]byte(nil), good[:12]...), 0xc0, 0x0c, 0, 1, 0, 1), // a name pointing at itself
		good[:len(good)-3], // cut short
		append(append([]byte(nil), good[:12]...), append([]byte{64}, make([]byte, 64)...)...), // a 64-byte label
		response,
	}
	for _, p := range junk {
		if b := r.raw(t, p, 300*time.Millisecond); b != nil {
			t.Fatalf("reply of %d bytes to %q", len(b), p)
		}
	}
	if got := r.metric(t, "malformed"); got != len(junk) {
		t.Fatalf("registry_dns_queries_total{result=malformed} = %d, want %d", got, len(junk))
	}
	// Over TCP, junk ends the connection without a reply.
	c, err := net.Dial("tcp", r.dns)
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	c.Write([]byte{0, 5, 1, 2, 3, 4, 5})
	c.SetReadDeadline(time.Now().Add(10 * time.Second))
	if n, err := c.Read(make([]byte, 512)); n != 0 || err == nil || isTimeout(err) {
		t.Fatalf("TCP junk: read %d bytes, %v; want the connection closed", n, err)
	}
	for _, network := range []string{"udp", "tcp"} {
		m := r.exchange(t, network, new(dns.Msg).SetQuestion("web.service.registry.", dns.TypeA))
		if len(m.Answer) != 1 || m.Answer[0].(*dns.A).A.String() != "10.0.0.1" {
			t.Fatalf("%s after junk: %v", network, m)
		}
	}
}

func isTimeout(err error) bool {
	ne, ok := err.(net.Error)
	return ok && ne.Timeout()
}

// A source past --dns-rate is dropped, and counted; within the rate it is
// answered.
func TestRateLimited(t *testing.T) {
	const rate, sent = 20, 100
	r := startRegnode(t, func(c *dnsapi.Config) { c.Rate = rate })
	r.register(t, &registryv1.Instance{Service: "web", Id: "a", Address: "10.0.0.1:80"})
	c, err := net.Dial("udp", r.dns)
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	start := time.Now()
	for i := range sent {
		q := new(dns.Msg).SetQuestion("web.service.registry.", dns.TypeA)
		q.Id = uint16(i)
		b, _ := q.Pack()
		if _, err := c.Write(b); err != nil {
			t.Fatal(err)
		}
	}
	sending := time.Since(start)
	answered := 0
	buf := make([]byte, 4096)
	for {
		c.SetReadDeadline(time.Now().Add(time.Second))
		if _, err := c.Read(buf); err != nil {
			break
		}
		answered++
	}
	// The burst (one second's worth), plus what the rate refilled while
	// the queries were being sent.
	if most := rate + int(sending.Seconds()*rate) + 1; answered < rate || answered > most {
		t.Fatalf("%d of %d queries answered in %v; want %d..%d", answered, sent, sending, rate, most)
	}
	if got := r.metric(t, "ratelimited"); got != sent-answered {
		t.Fatalf("registry_dns_queries_total{result=ratelimited} = %d, want %d", got, sent-answered)
	}
	// Another second, and the source is answered again.
	time.Sleep(time.Second)
	if m := r.exchange(t, "udp", new(dns.Msg).SetQuestion("web.service.registry.", dns.TypeA)); len(m.Answer) != 1 {
		t.Fatalf("after a second: %v", m)
	}
}
