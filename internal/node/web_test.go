package node

import (
	"net"
	"testing"
)

// Writes over HTTP are allowed on loopback listeners only, and the API
// dials its own gRPC listener on loopback even when it listens on all
// addresses.
func TestWebLoopback(t *testing.T) {
	for _, c := range []struct {
		ip       string
		loopback bool
		target   string
	}{
		{"127.0.0.1", true, "127.0.0.1:7400"},
		{"127.0.0.2", true, "127.0.0.2:7400"},
		{"::1", true, "[::1]:7400"},
		{"0.0.0.0", false, "127.0.0.1:7400"},
		{"::", false, "[::1]:7400"},
		{"10.1.2.3", false, "10.1.2.3:7400"},
	} {
		a := &net.TCPAddr{IP: net.ParseIP(c.ip), Port: 7400}
		if c.ip == "0.0.0.0" {
			a.IP = net.IPv4zero.To4()
		}
		if got := isLoopback(a); got != c.loopback {
			t.Errorf("isLoopback(%s) = %v", a, got)
		}
		if got := loopbackTarget(a); got != c.target {
			t.Errorf("loopbackTarget(%s) = %s, want %s", a, got, c.target)
		}
	}
}
