package node

import (
	"context"
	"crypto/tls"
	"crypto/x509"
	"errors"
	"fmt"
	"net"
	"net/url"
	"strings"
	"time"

	"github.com/regcluster/registry/internal/embedded"
)

// validateSecurity checks the TLS and credential settings, and refuses a
// plaintext listener anyone off this host could reach unless Insecure.
func (c *Config) validateSecurity() error {
	if err := c.TLS.Validate(""); err != nil {
		return err
	}
	if err := c.EtcdTLS.Validate("--etcd-cert", "--etcd-key"); err != nil {
		return err
	}
	if c.EtcdUsername != "" && c.EtcdPassword == "" {
		return errors.New("--etcd-username needs a password: --etcd-password-file or REGNODE_ETCD_PASSWORD")
	}
	if c.EtcdUsername == "" && c.EtcdPassword != "" {
		return errors.New("an etcd password is set but --etcd-username is not")
	}
	if c.EmbedAuth && len(c.EtcdEndpoints) > 0 {
		return errors.New("--etcd-server-auth is for the embedded member; an external etcd's auth is its own (--etcd-username)")
	}
	if c.EtcdTLS.Enabled() {
		// etcd's client drops TLS for an http:// endpoint without a word.
		for _, ep := range c.EtcdEndpoints {
			if strings.HasPrefix(strings.TrimSpace(ep), "http://") {
				return fmt.Errorf("--etcd-endpoints %s is plain http, but --etcd-cacert/--etcd-cert is set: use https://", ep)
			}
		}
	}
	if len(c.EtcdEndpoints) == 0 {
		if err := c.Embed.ValidateTLS(); err != nil {
			return err
		}
	}
	if c.Insecure {
		return nil
	}
	open := func(flag, addr string) error {
		return fmt.Errorf("%w: --%s %s is not a loopback address and would serve without TLS; "+
			"give it a certificate (%s) or pass --insecure to serve plaintext anyway", ErrInsecureListener, flag, addr, certFlags(flag))
	}
	if !c.TLS.Enabled() {
		if c.Listen != "" && !loopbackHostPort(c.Listen) {
			return open("listen", c.Listen)
		}
		if c.MetricsListen != "" && c.MetricsListen != "off" && !loopbackHostPort(c.MetricsListen) {
			return open("metrics-listen", c.MetricsListen)
		}
	}
	if c.DNS.Listen != "" && !loopbackHostPort(c.DNS.Listen) {
		// DNS has no TLS and no tokens, whatever the API has.
		return fmt.Errorf("%w: --dns-listen %s is not a loopback address, and DNS has neither TLS nor tokens: "+
			"whoever reaches it reads every service's routable addresses; pass --insecure to serve it anyway", ErrInsecureListener, c.DNS.Listen)
	}
	if len(c.EtcdEndpoints) == 0 {
		for _, u := range c.Embed.ListenClientURLs {
			if p, err := url.Parse(u); err == nil && p.Scheme == "http" && !loopbackHostPort(p.Host) {
				return open("listen-client-urls", u)
			}
		}
		for _, u := range c.Embed.ListenPeerURLs {
			if p, err := url.Parse(u); err == nil && p.Scheme == "http" && !loopbackHostPort(p.Host) {
				return open("listen-peer-urls", u)
			}
		}
	}
	return nil
}

func certFlags(flag string) string {
	switch flag {
	case "listen-client-urls":
		return "https:// with --etcd-server-cert-file and --etcd-server-key-file"
	case "listen-peer-urls":
		return "https:// with --peer-cert-file and --peer-key-file"
	}
	return "--cert-file and --key-file"
}

// loopbackHostPort reports whether hostport only listens on this host:
// localhost or a loopback IP. An empty or unspecified host (":7400",
// "0.0.0.0:7400") listens on every interface.
func loopbackHostPort(hostport string) bool {
	host, _, err := net.SplitHostPort(hostport)
	if err != nil {
		return false
	}
	if host == "localhost" {
		return true
	}
	ip := net.ParseIP(host)
	return ip != nil && ip.IsLoopback()
}

// memberEndpoints are the URLs this regnode dials its own embedded member
// at: the addresses it listens on, with an unspecified host dialed as
// 127.0.0.1 (which the member's certificate must name when it serves
// https).
func memberEndpoints(m *embedded.Member, https bool) []string {
	scheme := "http://"
	if https {
		scheme = "https://"
	}
	var eps []string
	for _, l := range m.Clients {
		host, port, err := net.SplitHostPort(l.Addr().String())
		if err != nil {
			continue
		}
		if ip := net.ParseIP(host); ip != nil && ip.IsUnspecified() {
			host = "127.0.0.1"
		}
		eps = append(eps, scheme+net.JoinHostPort(host, port))
	}
	return eps
}

// etcdClientTLS is the TLS configuration of the etcd client (nil when no
// endpoint is https). Before etcd's client gets it, one handshake with the
// first https endpoint that answers tells a certificate problem (an
// unknown CA, a wrong host name, a client certificate refused) in words:
// etcd's client would only time out.
func (n *Node) etcdClientTLS(ctx context.Context, endpoints []string) (*tls.Config, error) {
	var https []string
	for _, ep := range endpoints {
		if strings.HasPrefix(ep, "https://") {
			https = append(https, strings.TrimPrefix(ep, "https://"))
		}
	}
	if len(https) == 0 {
		return nil, nil
	}
	cfg, err := n.cfg.EtcdTLS.Config(n.log)
	if err != nil {
		return nil, fmt.Errorf("etcd client TLS: %w", err)
	}
	for _, addr := range https {
		err := handshake(ctx, addr, cfg, tls.VersionTLS12)
		if err != nil && strings.Contains(err.Error(), "protocol version") {
			err = handshake(ctx, addr, cfg, 0) // an etcd of TLS 1.3 only
		}
		if err == nil {
			break
		}
		if certificateError(err) {
			hint := "check --etcd-cacert, --etcd-cert, --etcd-key"
			var op *net.OpError
			if errors.As(err, &op) && op.Op == "remote error" {
				hint = "etcd refused the handshake: does it want a client certificate of its CA? --etcd-cert, --etcd-key"
			}
			return nil, fmt.Errorf("TLS to etcd at %s failed (%s): %w", addr, hint, err)
		}
		// Not reachable: another endpoint may be, and etcd's client says
		// so below if none is.
	}
	return cfg, nil
}

// handshake completes one TLS handshake with addr, of at most maxVersion
// (0: any). TLS 1.2 is asked for first so that a server refusing our
// client certificate says so within the handshake (in TLS 1.3 the verdict
// comes after it).
func handshake(ctx context.Context, addr string, cfg *tls.Config, maxVersion uint16) error {
	c := cfg.Clone()
	c.MaxVersion = maxVersion
	if host, _, err := net.SplitHostPort(addr); err == nil && c.ServerName == "" {
		c.ServerName = host
	}
	ctx, cancel := context.WithTimeout(ctx, 3*time.Second)
	defer cancel()
	d := tls.Dialer{Config: c}
	conn, err := d.DialContext(ctx, "tcp", addr)
	if err != nil {
		return err
	}
	return conn.Close()
}

func certificateError(err error) bool {
	var (
		verify   *tls.CertificateVerificationError
		unknown  x509.UnknownAuthorityError
		hostname x509.HostnameError
		invalid  x509.CertificateInvalidError
		op       *net.OpError
	)
	if errors.As(err, &op) && op.Op == "remote error" {
		return true // the server's alert: it refused our certificate
	}
	return errors.As(err, &verify) || errors.As(err, &unknown) ||
		errors.As(err, &hostname) || errors.As(err, &invalid)
}
