package node

import "net"

// SetHostIPs makes the host's addresses ips for the advertised address's
// default, until restore.
func SetHostIPs(ips ...string) (restore func()) {
	old := hostIPs
	hostIPs = func() ([]net.IP, error) {
		var out []net.IP
		for _, s := range ips {
			out = append(out, net.ParseIP(s))
		}
		return out, nil
	}
	return func() { hostIPs = old }
}

// AdvertiseFor is the address announced by a regnode of AdvertiseAddress
// advertise whose API listener is bound at addr.
var AdvertiseFor = advertiseFor
