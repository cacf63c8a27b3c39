package tlsfiles_test

import (
	"crypto/tls"
	"errors"
	"io"
	"log/slog"
	"os"
	"strings"
	"testing"

	"github.com/regcluster/registry/internal/tlsfiles"
	"github.com/regcluster/registry/internal/tlstest"
)

var quiet = slog.New(slog.NewTextHandler(io.Discard, nil))

// serve accepts TLS connections of cfg on loopback until the test ends,
// completing each handshake.
func serve(t *testing.T, cfg *tls.Config) string {
	t.Helper()
	l, err := tls.Listen("tcp", "127.0.0.1:0", cfg)
	if err != nil {
		t.Fatal(err)
	}
	done := make(chan struct{})
	go func() {
		defer close(done)
		for {
			c, err := l.Accept()
			if err != nil {
				return
			}
			_ = c.(*tls.Conn).Handshake()
			c.Close()
		}
	}()
	t.Cleanup(func() { l.Close(); <-done })
	return l.Addr().String()
}

func servedSerial(t *testing.T, addr string, cfg *tls.Config) string {
	t.Helper()
	c, err := tls.Dial("tcp", addr, cfg)
	if err != nil {
		t.Fatalf("dial %s: %v", addr, err)
	}
	defer c.Close()
	return c.ConnectionState().PeerCertificates[0].SerialNumber.String()
}

// A replaced certificate is served from the next handshake on; a key
// that no longer matches its certificate keeps the last good pair.
func TestServerReloadsOnChange(t *testing.T) {
	ca := tlstest.NewCA(t, "ca")
	first := ca.Server(t, "server")
	cfg, err := tlsfiles.ServerConfig(tlsfiles.Server{CertFile: first.CertFile, KeyFile: first.KeyFile}, quiet)
	if err != nil {
		t.Fatal(err)
	}
	addr := serve(t, cfg)
	ccfg := tlstest.ClientConfig(t, ca, nil)
	if got := servedSerial(t, addr, ccfg); got != first.Serial.String() {
		t.Fatalf("served serial %s, want %s", got, first.Serial)
	}

	second := ca.Server(t, "server2")
	tlstest.Replace(t, first, second)
	if got := servedSerial(t, addr, ccfg); got != second.Serial.String() {
		t.Fatalf("after rotation served serial %s, want %s", got, second.Serial)
	}

	// Only the key changes, to one of another certificate: the pair does
	// not load, the last good one is served.
	third := ca.Server(t, "server3")
	b, err := os.ReadFile(third.KeyFile)
	if err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(first.KeyFile, b, 0o600); err != nil {
		t.Fatal(err)
	}
	if got := servedSerial(t, addr, ccfg); got != second.Serial.String() {
		t.Fatalf("with a mismatched key served serial %s, want the last good %s", got, second.Serial)
	}
	// Then the certificate catches up.
	tlstest.Replace(t, first, third)
	if got := servedSerial(t, addr, ccfg); got != third.Serial.String() {
		t.Fatalf("after the certificate caught up served serial %s, want %s", got, third.Serial)
	}
}

// A trusted CA file requires a client certificate of that CA (etcd's
// meaning), and a replaced CA file is trusted from the next handshake.
func TestServerClientCA(t *testing.T) {
	ca := tlstest.NewCA(t, "ca")
	clientCA := tlstest.NewCA(t, "clients")
	other := tlstest.NewCA(t, "other")
	srv := ca.Server(t, "server")
	caFile := clientCA.CertFile
	cfg, err := tlsfiles.ServerConfig(tlsfiles.Server{CertFile: srv.CertFile, KeyFile: srv.KeyFile, TrustedCAFile: caFile, ClientCertAuth: true}, quiet)
	if err != nil {
		t.Fatal(err)
	}
	addr := serve(t, cfg)
	good := clientCA.Client(t, "good")
	stranger := other.Client(t, "stranger")
	try := func(client *tlstest.Files) error {
		c, err := tls.Dial("tcp", addr, tlstest.ClientConfig(t, ca, client))
		if err != nil {
			return err
		}
		defer c.Close()
		// In TLS 1.3 the server's verdict on the client certificate
		// arrives after the client's handshake: read to hear it.
		_, err = c.Read(make([]byte, 1))
		if errors.Is(err, io.EOF) {
			return nil // accepted, then closed by serve
		}
		return err
	}
	if err := try(&good); err != nil {
		t.Fatalf("client of the trusted CA refused: %v", err)
	}
	if err := try(nil); err == nil || !strings.Contains(err.Error(), "certificate required") {
		t.Fatalf("client without a certificate: err = %v, want certificate required", err)
	}
	if err := try(&stranger); err == nil || !strings.Contains(err.Error(), "unknown certificate authority") {
		t.Fatalf("client of another CA: err = %v, want unknown certificate authority", err)
	}
	b, err := os.ReadFile(other.CertFile)
	if err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(caFile+".tmp", b, 0o600); err != nil {
		t.Fatal(err)
	}
	if err := os.Rename(caFile+".tmp", caFile); err != nil {
		t.Fatal(err)
	}
	if err := try(&stranger); err != nil {
		t.Fatalf("after the CA file was replaced, its client is refused: %v", err)
	}
}

func TestValidate(t *testing.T) {
	for _, tc := range []struct {
		s    tlsfiles.Server
		want string
	}{
		{tlsfiles.Server{CertFile: "c"}, "--peer-cert-file and --peer-key-file go together"},
		{tlsfiles.Server{CertFile: "c", KeyFile: "k", ClientCertAuth: true}, "--peer-client-cert-auth needs --peer-trusted-ca-file"},
		{tlsfiles.Server{TrustedCAFile: "ca"}, "--peer-trusted-ca-file needs --peer-cert-file"},
	} {
		if err := tc.s.Validate("peer-"); err == nil || !strings.Contains(err.Error(), tc.want) {
			t.Errorf("Validate(%+v) = %v, want %q", tc.s, err, tc.want)
		}
	}
	if err := (tlsfiles.Server{CertFile: "c", KeyFile: "k", TrustedCAFile: "ca", ClientCertAuth: true}).Validate(""); err != nil {
		t.Errorf("full server settings: %v", err)
	}
	if _, err := tlsfiles.ServerConfig(tlsfiles.Server{CertFile: "/nonexistent/c", KeyFile: "/nonexistent/k"}, quiet); err == nil || !strings.Contains(err.Error(), "/nonexistent/c") {
		t.Errorf("missing files: err = %v, want it named", err)
	}
}

// etcd's meaning: a trusted CA file alone already requires a client
// certificate of it.
func TestTrustedCAAloneRequiresClientCert(t *testing.T) {
	ca := tlstest.NewCA(t, "ca")
	srv := ca.Server(t, "server")
	cfg, err := tlsfiles.ServerConfig(tlsfiles.Server{CertFile: srv.CertFile, KeyFile: srv.KeyFile, TrustedCAFile: ca.CertFile}, quiet)
	if err != nil {
		t.Fatal(err)
	}
	addr := serve(t, cfg)
	c, err := tls.Dial("tcp", addr, tlstest.ClientConfig(t, ca, nil))
	if err == nil {
		_, err = c.Read(make([]byte, 1))
		c.Close()
	}
	if err == nil || !strings.Contains(err.Error(), "certificate required") {
		t.Fatalf("client without a certificate: err = %v, want certificate required", err)
	}
}
