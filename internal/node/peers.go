package node

import (
	"context"
	"fmt"
	"net"
	"regexp"
	"strconv"
	"strings"
	"time"

	clientv3 "go.etcd.io/etcd/client/v3"
	"go.etcd.io/etcd/client/v3/concurrency"
	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials"
	"google.golang.org/grpc/credentials/insecure"

	"github.com/regcluster/registry/internal/configerr"
	"github.com/regcluster/registry/internal/server"
	"github.com/regcluster/registry/internal/tlsfiles"
	registryv1 "github.com/regcluster/registry/proto/registry/v1"
)

// Regnodes announce themselves: <prefix>nodes/<advertised API address>
// holds the regnode's name under a session lease (keyed by address, not
// name: the address is what a peer dials, and it is unique where names
// need not be, e.g. several regnodes of a host with the default name on
// port 0), so that the key lives exactly as long as the regnode does (a
// killed one's key goes when its lease expires). A regnode answering
// WaitApplied reads the announcements and asks every other regnode for
// its subscribers. etcd is the one place every regnode, and every caller
// through any regnode, agrees on who is there; a list given to regctl or
// the SDK could miss a regnode they were not told of.
//
// The address announced is Config.AdvertiseAddress, by default the
// listener's, which is dialable except when its host is unspecified: a
// regnode on 0.0.0.0:7400 announcing "0.0.0.0:7400" would be dialed by
// every peer as the peer itself (and every such regnode would write the
// same key). For that case the default is the host's one address
// (AdvertiseHost), rather than a refusal to start: a container or a pod,
// which must listen on 0.0.0.0 (the shipped Dockerfile and manifest do),
// has exactly one, the one its peers dial; a host with several is refused,
// since a guess would be announced silently and found wrong only at a
// drain.

// nodesKey is where the announcements live.
func nodesKey(prefix string) string { return prefix + "nodes/" }

// AdvertiseHost is the host a regnode listening on the unspecified host
// listenHost (0.0.0.0, :: or "") advertises, chosen from ips, the
// addresses of this host's interfaces that are up and not loopback: its
// one global unicast IPv4 address, or, for :: (or ""), if it has none,
// its one global unicast IPv6 address (link-local ones are never
// dialable by a peer without a zone). None, or several, is an error
// saying which (Validate and Start add the flag that settles it).
func AdvertiseHost(listenHost string, ips []net.IP) (string, error) {
	var v4, v6 []string
	for _, ip := range ips {
		switch {
		case !ip.IsGlobalUnicast():
		case ip.To4() != nil:
			v4 = append(v4, ip.String())
		default:
			v6 = append(v6, ip.String())
		}
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
	return "", fmt.Errorf("this host has several addresses (%s) and regnode cannot tell which one other regnodes dial", strings.Join(pick, ", "))
}

// hostIPs lists the addresses of this host's interfaces that are up and
// not loopback (a variable so that tests can give a host several).
var hostIPs = interfaceIPs

func interfaceIPs() ([]net.IP, error) {
	ifs, err := net.Interfaces()
	if err != nil {
		return nil, fmt.Errorf("list the network interfaces: %w", err)
	}
	var ips []net.IP
	for _, ifc := range ifs {
		if ifc.Flags&net.FlagUp == 0 || ifc.Flags&net.FlagLoopback != 0 {
			continue
		}
		addrs, err := ifc.Addrs()
		if err != nil {
			return nil, fmt.Errorf("list the addresses of %s: %w", ifc.Name, err)
		}
		for _, a := range addrs {
			if ipn, ok := a.(*net.IPNet); ok {
				ips = append(ips, ipn.IP)
			}
		}
	}
	return ips, nil
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
		ips, err := hostIPs()
		if err == nil {
			_, err = AdvertiseHost(host, ips)
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
	ips, err := hostIPs()
	if err == nil {
		host, err = AdvertiseHost(host, ips)
	}
	if err != nil {
		return "", fmt.Errorf("the API listens on %s, every address of this host, and %w: set --advertise-address", addr, err)
	}
	return net.JoinHostPort(host, port), nil
}

// announce writes this regnode's announcement of addr (advertiseAddr)
// under a new session; the session is returned for keepAnnounced to hold.
func (n *Node) announce(ctx context.Context, addr string) (*concurrency.Session, error) {
	ttl := int(n.cfg.SessionTTL / time.Second)
	if ttl <= 0 {
		ttl = 10
	}
	// The grant honours ctx; the session itself lives on the client's
	// context, so that Close can still revoke it while the regnode stops.
	lr, err := n.cli.Grant(ctx, int64(ttl))
	if err != nil {
		return nil, fmt.Errorf("grant the lease of the regnode announcement: %w", err)
	}
	sess, err := concurrency.NewSession(n.cli, concurrency.WithTTL(ttl), concurrency.WithLease(lr.ID))
	if err != nil {
		return nil, fmt.Errorf("open the session of the regnode announcement: %w", err)
	}
	pctx, cancel := context.WithTimeout(ctx, 10*time.Second)
	defer cancel()
	if _, err := n.cli.Put(pctx, nodesKey(n.cfg.Prefix)+addr, n.cfg.Name, clientv3.WithLease(sess.Lease())); err != nil {
		sess.Close()
		return nil, fmt.Errorf("announce regnode %s at %s: %w", n.cfg.Name, addr, err)
	}
	return sess, nil
}

// keepAnnounced holds sess until ctx ends, when the regnode stops (then
// revokes it: the key goes at once), announcing again whenever the session
// is lost.
func (n *Node) keepAnnounced(ctx context.Context, sess *concurrency.Session, addr string) {
	for {
		select {
		case <-ctx.Done():
			sess.Close()
			return
		case <-sess.Done():
		}
		n.log.Warn("regnode announcement session lost; announcing again", "node", n.cfg.Name)
		for {
			s, err := n.announce(ctx, addr)
			if err == nil {
				sess = s
				break
			}
			select {
			case <-ctx.Done():
				return
			case <-time.After(time.Second):
			}
		}
	}
}

// peers lists the regnodes announced (this one included).
func (n *Node) peers(ctx context.Context) ([]server.Peer, error) {
	key := nodesKey(n.cfg.Prefix)
	resp, err := n.cli.Get(ctx, key, clientv3.WithPrefix())
	if err != nil {
		return nil, err
	}
	out := make([]server.Peer, 0, len(resp.Kvs))
	for _, kv := range resp.Kvs {
		out = append(out, server.Peer{Name: string(kv.Value), Addr: strings.TrimPrefix(string(kv.Key), key)})
	}
	return out, nil
}

// dialPeer connects to another regnode's API: plaintext, or TLS with this
// regnode's trusted CA as roots and its own key pair as the client
// certificate (what --client-cert-auth asks of a peer).
func (n *Node) dialPeer(addr string) (registryv1.RegistryClient, func(), error) {
	creds := insecure.NewCredentials()
	if n.cfg.TLS.Enabled() {
		tc, err := tlsfiles.Client{CAFile: n.cfg.TLS.TrustedCAFile, CertFile: n.cfg.TLS.CertFile, KeyFile: n.cfg.TLS.KeyFile}.Config(n.log)
		if err != nil {
			return nil, nil, fmt.Errorf("TLS to regnode %s: %w", addr, err)
		}
		creds = credentials.NewTLS(tc)
	}
	cc, err := grpc.NewClient(addr, grpc.WithTransportCredentials(creds))
	if err != nil {
		return nil, nil, fmt.Errorf("connect to regnode %s: %w", addr, err)
	}
	return registryv1.NewRegistryClient(cc), func() { cc.Close() }, nil
}
