package node

import (
	"bufio"
	"fmt"
	"net"
	"os"
	"regexp"
	"strconv"
	"strings"

	"github.com/regcluster/registry/internal/configerr"
)

// The default advertised address of a regnode listening on every address
// (0.0.0.0, ::): the address of the interface of this host's default
// route, with the port bound, as kube-apiserver chooses its
// --advertise-address over an unspecified --bind-address. That is the
// address other hosts reach this one by: a container's or a pod's one
// address; on a host that also has bridges (docker0) or VPNs, the one
// its traffic leaves by. Where that does not settle it (no default route,
// or several addresses on its interface, and not exactly one address on
// the host), regnode refuses to start rather than announce a guess,
// which would be found wrong only at a drain.

// Host is what AdvertiseHost chooses from: the global unicast addresses
// of this host's interfaces that are up and not loopback, and those of
// them on the interface of its IPv4 default route.
type Host struct {
	IPs, Routed []net.IP
}

// AdvertiseHost is the host advertised by a regnode listening on the
// unspecified host listenHost (0.0.0.0, :: or ""): the one IPv4 address
// of the default route's interface; else the host's one IPv4 address;
// else, for :: (or "") only, its one IPv6 address. Link-local addresses
// never count (a peer cannot dial one without a zone). None, or several,
// is an error saying which (Validate and Start add the flag that settles
// it).
func AdvertiseHost(listenHost string, h Host) (string, error) {
	v4, v6 := split(h.IPs)
	if routed, _ := split(h.Routed); len(routed) == 1 {
		return routed[0], nil
	}
	pick := v4
	if len(v4) == 0 && (listenHost == "" || net.ParseIP(listenHost).To4() == nil) {
		pick = v6
	}
	switch len(pick) {
	case 1:
		return pick[0], nil
	case 0:
		return "", fmt.Errorf("this host has no address other regnodes could dial")
	}
	return "", fmt.Errorf("this host has several addresses (%s) and no one default route's address to choose", strings.Join(pick, ", "))
}

// split sorts the global unicast addresses of ips into IPv4 and IPv6.
func split(ips []net.IP) (v4, v6 []string) {
	for _, ip := range ips {
		switch {
		case !ip.IsGlobalUnicast():
		case ip.To4() != nil:
			v4 = append(v4, ip.String())
		default:
			v6 = append(v6, ip.String())
		}
	}
	return v4, v6
}

// thisHost reads this host's addresses for AdvertiseHost (a variable so
// that tests can give a host several).
var thisHost = readHost

func readHost() (Host, error) {
	ifs, err := net.Interfaces()
	if err != nil {
		return Host{}, fmt.Errorf("list the network interfaces: %w", err)
	}
	route := defaultRouteInterface()
	var h Host
	for _, ifc := range ifs {
		if ifc.Flags&net.FlagUp == 0 || ifc.Flags&net.FlagLoopback != 0 {
			continue
		}
		addrs, err := ifc.Addrs()
		if err != nil {
			return Host{}, fmt.Errorf("list the addresses of %s: %w", ifc.Name, err)
		}
		for _, a := range addrs {
			if ipn, ok := a.(*net.IPNet); ok {
				h.IPs = append(h.IPs, ipn.IP)
				if ifc.Name == route {
					h.Routed = append(h.Routed, ipn.IP)
				}
			}
		}
	}
	return h, nil
}

// defaultRouteInterface names the interface of the IPv4 default route of
// the lowest metric in Linux's /proc/net/route ("" if there is none, or
// no such file: elsewhere only the host's one address is chosen).
func defaultRouteInterface() string {
	f, err := os.Open("/proc/net/route")
	if err != nil {
		return ""
	}
	defer f.Close()
	best, bestMetric := "", -1
	sc := bufio.NewScanner(f)
	for sc.Scan() {
		// Iface Destination Gateway Flags RefCnt Use Metric Mask ...; the
		// header's Destination is not 00000000.
		fs := strings.Fields(sc.Text())
		if len(fs) < 8 || fs[1] != "00000000" || fs[7] != "00000000" {
			continue
		}
		flags, err := strconv.ParseUint(fs[3], 16, 32)
		if err != nil || flags&1 == 0 { // RTF_UP
			continue
		}
		metric, err := strconv.Atoi(fs[6])
		if err != nil {
			continue
		}
		if bestMetric < 0 || metric < bestMetric {
			best, bestMetric = fs[0], metric
		}
	}
	return best
}

// unspecifiedHost says whether host (of a host:port) means every address.
func unspecifiedHost(host string) bool {
	if host == "" {
		return true
	}
	ip := net.ParseIP(host)
	return ip != nil && ip.IsUnspecified()
}

// hostName matches a DNS name (labels of letters, digits and '-', not at
// either end), as an advertised host that is not an IP address must be.
var hostName = regexp.MustCompile(`^([A-Za-z0-9]([A-Za-z0-9-]{0,61}[A-Za-z0-9])?)(\.[A-Za-z0-9]([A-Za-z0-9-]{0,61}[A-Za-z0-9])?)*\.?$`)

// validateAdvertise checks AdvertiseAddress, or, when it is empty and
// Listen's host is unspecified, that the default can be chosen.
func (c *Config) validateAdvertise() error {
	const rule = "must be host:port that other regnodes can dial: a DNS name or an IP address that is not unspecified, and a port of 1..65535"
	if c.AdvertiseAddress == "" {
		host, _, err := net.SplitHostPort(c.Listen)
		if err != nil || !unspecifiedHost(host) {
			return nil // Listen's own check speaks of a bad Listen
		}
		h, err := thisHost()
		if err == nil {
			_, err = AdvertiseHost(host, h)
		}
		if err != nil {
			return configerr.New(ErrInvalidConfig, "node", "AdvertiseAddress", nil,
				fmt.Sprintf("must be set to the HOST:PORT other regnodes dial: --listen %s is every address of this host, and %v", c.Listen, err))
		}
		return nil
	}
	host, port, err := net.SplitHostPort(c.AdvertiseAddress)
	if err != nil || len(host) > 253 {
		return invalid("AdvertiseAddress", c.AdvertiseAddress, rule)
	}
	if p, err := strconv.Atoi(port); err != nil || p < 1 || p > 65535 {
		return invalid("AdvertiseAddress", c.AdvertiseAddress, rule)
	}
	if ip := net.ParseIP(host); ip != nil {
		if ip.IsUnspecified() {
			return invalid("AdvertiseAddress", c.AdvertiseAddress, rule)
		}
	} else if !hostName.MatchString(host) {
		return invalid("AdvertiseAddress", c.AdvertiseAddress, rule)
	}
	return nil
}

// advertiseAddr is the address this regnode announces, once its API
// listener is bound: Config.AdvertiseAddress, or the listener's address,
// its unspecified host replaced by AdvertiseHost's choice.
func (n *Node) advertiseAddr() (string, error) {
	return advertiseFor(n.cfg.AdvertiseAddress, n.Addr())
}

// advertiseFor is advertiseAddr of a regnode whose AdvertiseAddress is
// advertise and whose API listener is bound at addr.
func advertiseFor(advertise, addr string) (string, error) {
	if advertise != "" {
		return advertise, nil
	}
	host, port, err := net.SplitHostPort(addr)
	if err != nil {
		return "", fmt.Errorf("the API listener's address %q: %w", addr, err)
	}
	if !unspecifiedHost(host) {
		return addr, nil
	}
	h, err := thisHost()
	if err == nil {
		host, err = AdvertiseHost(host, h)
	}
	if err != nil {
		return "", fmt.Errorf("the API listens on %s, every address of this host, and %w: set --advertise-address", addr, err)
	}
	return net.JoinHostPort(host, port), nil
}
