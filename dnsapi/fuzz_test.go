package dnsapi

import (
	"encoding/binary"
	"fmt"
	"net"
	"testing"

	"github.com/miekg/dns"

	registryv1 "github.com/regcluster/registry/proto/registry/v1"
)

// FuzzServeDNS feeds raw packets through what the server does with a
// packet read: admit (drop what does not decode), the header check miekg's
// server makes with accept, then reply. Whatever the bytes, nothing
// panics, and an answered query gets a reply that packs, carries its id,
// fits the transport's size and sets TC whenever it left records out.
// The seeds in testdata/fuzz/FuzzServeDNS hold queries of every name form,
// EDNS0, and broken packets.
func FuzzServeDNS(f *testing.F) {
	for _, q := range []struct {
		name  string
		qtype uint16
		edns  uint16
	}{
		{"web.service.registry.", dns.TypeA, 0},
		{"_web._tcp.service.registry.", dns.TypeSRV, 1232},
		{"eu.web.service.registry.", dns.TypeAAAA, 4096},
		{"0a000001.addr.registry.", dns.TypeA, 0},
		{"registry.", dns.TypeSOA, 0},
		{"nope.service.registry.", dns.TypeA, 0},
	} {
		m := new(dns.Msg).SetQuestion(q.name, q.qtype)
		if q.edns != 0 {
			m.SetEdns0(q.edns, false)
		}
		b, err := m.Pack()
		if err != nil {
			f.Fatal(err)
		}
		f.Add(b, false)
		f.Add(b, true)
	}
	var ins []*registryv1.Instance
	for i := range 300 {
		ins = append(ins, &registryv1.Instance{Service: "web", Id: fmt.Sprint(i), Address: fmt.Sprintf("10.0.%d.%d:%d", i/250, i%250+1, 8000+i),
			Zone: []string{"eu", "us"}[i%2], Weight: uint32(i%1000 + 1), Lifecycle: serving})
	}
	ins = append(ins, &registryv1.Instance{Service: "web", Id: "v6", Address: "[fd00::1]:80", Lifecycle: serving},
		&registryv1.Instance{Service: "web", Id: "host", Address: "a.example:80", Lifecycle: serving},
		&registryv1.Instance{Service: "idle", Id: "x", Address: "10.9.0.1:80", Lifecycle: draining})
	s := testServer(f, ins...)
	from := &net.UDPAddr{IP: net.IPv4(127, 0, 0, 1), Port: 53000}
	s.limit = newSources(1e9, 1<<30, 4) // the fuzzer is no flood
	f.Fuzz(func(t *testing.T, raw []byte, tcp bool) {
		if !s.admit(raw, from) {
			return // dropped, unanswered
		}
		req, ok := decode(raw)
		if !ok {
			t.Fatal("admitted a packet that does not decode")
		}
		if s.accept(header(raw)) != dns.MsgAccept {
			return // miekg's server answers FORMERR or NOTIMP itself
		}
		size := s.replySize(req, tcp)
		m, result := s.reply(req, size)
		b, err := m.Pack()
		if err != nil {
			t.Fatalf("reply (%s) does not pack: %v\n%v", result, err, m)
		}
		if len(b) > size {
			t.Fatalf("reply of %d bytes, the limit is %d", len(b), size)
		}
		if m.Id != req.Id || !m.Response {
			t.Fatalf("reply id %d response %v to query %d", m.Id, m.Response, req.Id)
		}
		if (result == ResultTruncated) != m.Truncated {
			t.Fatalf("result %s with TC %v", result, m.Truncated)
		}
	})
}

// header is m's header as dns.MsgAcceptFunc sees it; m is at least 12
// bytes long (a packet that decoded).
func header(m []byte) dns.Header {
	u := func(i int) uint16 { return binary.BigEndian.Uint16(m[i:]) }
	return dns.Header{Id: u(0), Bits: u(2), Qdcount: u(4), Ancount: u(6), Nscount: u(8), Arcount: u(10)}
}
