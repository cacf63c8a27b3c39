package dnsapi

import (
	"net/netip"
	"testing"
	"time"
)

// Each source has its own bucket; a flood of distinct sources never holds
// more than MaxSources entries, and a source seen recently keeps its
// bucket through it.
func TestSourcesBounded(t *testing.T) {
	s := newSources(1, 2, 100)
	now := time.Now()
	a, b := netip.MustParseAddr("192.0.2.1"), netip.MustParseAddr("2001:db8::1")
	for i, want := range []bool{true, true, false} {
		if got := s.allow(a, now); got != want {
			t.Fatalf("query %d of a: %v, want %v", i, got, want)
		}
	}
	if !s.allow(b, now) {
		t.Fatal("b refused for a's queries")
	}
	if !s.allow(a, now.Add(time.Second)) {
		t.Fatal("a not refilled after a second")
	}
	for i := range 100000 {
		src := netip.AddrFrom4([4]byte{10, byte(i >> 16), byte(i >> 8), byte(i)})
		s.allow(src, now)
		if i%40 == 0 {
			s.allow(a, now) // a keeps coming back: its bucket stays empty
		}
		if n := s.len(); n > 100 {
			t.Fatalf("%d sources tracked, at most 100", n)
		}
	}
	if s.allow(a, now.Add(time.Second)) {
		t.Fatal("a, seen all along, was forgotten and got a fresh burst")
	}
}
