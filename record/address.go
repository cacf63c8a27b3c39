package record

import (
	"errors"
	"net"
	"net/netip"
	"strconv"
	"strings"
)

// Limits of an address (RFC 1035 §2.3.4, RFC 1123 §2.1).
const (
	maxHostLen  = 253
	maxLabelLen = 63
)

// ValidAddress reports why address is not host:port, or nil; the reason
// does not repeat the address, so callers can say which one it was. The host is a
// DNS name of RFC 1123 labels (letters, digits and '-', 1..63 characters,
// neither starting nor ending with '-'; at most 253 characters, one trailing
// '.' allowed; the last label not all digits, so "300.1.1.1" is no name), a
// dotted-quad IPv4 literal, or an IPv6 literal in brackets without a zone.
// The port is canonical decimal 1..65535: digits only, no sign, no leading
// zero. Every address accepted is exactly net.JoinHostPort of its parts.
func ValidAddress(address string) error {
	if address == "" {
		return fieldErr("address", "must not be empty")
	}
	host, port, err := net.SplitHostPort(address)
	if err != nil {
		why := err.Error()
		var ae *net.AddrError
		if errors.As(err, &ae) {
			why = ae.Err
		}
		return fieldErr("address", "not host:port (%s)", why)
	}
	if err := validPort(port); err != nil {
		return fieldErr("address", "%v", err)
	}
	if host == "" {
		return fieldErr("address", "no host")
	}
	// SplitHostPort takes "[h]:p" for any h: only IPv6 belongs in brackets.
	if strings.HasPrefix(address, "[") {
		ip, err := netip.ParseAddr(host)
		if err != nil || !ip.Is6() || ip.Zone() != "" {
			return fieldErr("address", "host %s: only an IPv6 address without a zone goes in brackets", strconv.Quote("["+host+"]"))
		}
		return nil
	}
	if ip, err := netip.ParseAddr(host); err == nil && ip.Is4() {
		return nil
	}
	if reason := dnsNameProblem(host); reason != "" {
		return fieldErr("address", "host %q is neither an IP address nor a DNS name: %s", host, reason)
	}
	return nil
}

// portError is why a port is refused; its text is the reason a FieldError
// gives.
type portError string

func (e portError) Error() string { return string(e) }

// validPort checks a port in canonical decimal form 1..65535.
func validPort(port string) error {
	if port == "" {
		return portError("port is missing")
	}
	for i := 0; i < len(port); i++ {
		if port[i] < '0' || port[i] > '9' {
			return portError("port " + strconv.Quote(port) + " is not a decimal number")
		}
	}
	if port[0] == '0' && len(port) > 1 {
		return portError("port " + strconv.Quote(port) + " has a leading zero")
	}
	// Digits too many for an int are out of range too: Atoi fails on them.
	if p, err := strconv.Atoi(port); err != nil || p < 1 || p > 65535 {
		return portError("port " + port + " is out of range 1..65535")
	}
	return nil
}

// dnsNameProblem says why host is not an RFC 1123 DNS name, or "".
func dnsNameProblem(host string) string {
	name := strings.TrimSuffix(host, ".")
	if name == "" {
		return "empty name"
	}
	if len(name) > maxHostLen {
		return strconv.Itoa(len(name)) + " characters, at most " + strconv.Itoa(maxHostLen)
	}
	labels := strings.Split(name, ".")
	for _, l := range labels {
		if l == "" {
			return "empty label"
		}
		if len(l) > maxLabelLen {
			return "label of " + strconv.Itoa(len(l)) + " characters, at most " + strconv.Itoa(maxLabelLen)
		}
		for i := 0; i < len(l); i++ {
			c := l[i]
			if !(c >= 'a' && c <= 'z' || c >= 'A' && c <= 'Z' || c >= '0' && c <= '9' || c == '-') {
				return "only letters, digits, '-' and '.' are allowed"
			}
		}
		if l[0] == '-' || l[len(l)-1] == '-' {
			return "a label starts or ends with '-'"
		}
	}
	// RFC 3696 §2: a top-level domain is never all digits; a name that is
	// is a malformed IP address ("300.1.1.1", "10.0.0.01").
	last := labels[len(labels)-1]
	if strings.Trim(last, "0123456789") == "" {
		return "the last label is all digits (not a valid IPv4 address either)"
	}
	return ""
}
