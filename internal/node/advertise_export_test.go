package node

import "net"

// SetHost makes this host's addresses all, routed of them on the default
// route's interface, for the advertised address's default, until
// restore.
func SetHost(routed []string, all ...string) (restore func()) {
	old := thisHost
	parse := func(ss []string) []net.IP {
		var out []net.IP
		for _, s := range ss {
			out = append(out, net.ParseIP(s))
		}
		return out
	}
	thisHost = func() (Host, error) { return Host{IPs: parse(all), Routed: parse(routed)}, nil }
	return func() { thisHost = old }
}

// AdvertiseFor is the address announced by a regnode of AdvertiseAddress
// advertise whose API listener is bound at addr.
var AdvertiseFor = advertiseFor

// DefaultRouteInterface names the interface of this host's IPv4 default
// route, as the advertised address's default reads it.
var DefaultRouteInterface = defaultRouteInterface

// ReadHost reads this host's addresses, as the advertised address's
// default does.
var ReadHost = readHost
