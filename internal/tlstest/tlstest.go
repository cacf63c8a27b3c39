// Package tlstest makes real X.509 certificates for tests: a CA (ECDSA
// P-256) that issues server and client certificates, written as PEM files
// into a test's temporary directory.
package tlstest

import (
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/tls"
	"crypto/x509"
	"crypto/x509/pkix"
	"encoding/pem"
	"math/big"
	"net"
	"os"
	"path/filepath"
	"sync/atomic"
	"testing"
	"time"
)

// serials hands out certificate serial numbers unique within the test
// binary, so a test can tell which certificate a server presented.
var serials atomic.Int64

// CA is a certificate authority living in one directory.
type CA struct {
	// Name is its common name.
	Name string
	// CertFile is its certificate (PEM), the file a trusted-CA flag names.
	CertFile string
	// Cert is its parsed certificate.
	Cert *x509.Certificate

	dir string
	key *ecdsa.PrivateKey
}

// Files are the PEM files of one issued certificate.
type Files struct {
	// CertFile and KeyFile are the certificate and its private key.
	CertFile, KeyFile string
	// Serial is the certificate's serial number.
	Serial *big.Int
}

// NewCA makes a CA named name with its files in a new temporary directory.
func NewCA(t testing.TB, name string) *CA {
	t.Helper()
	key := newKey(t)
	tmpl := &x509.Certificate{
		SerialNumber:          big.NewInt(serials.Add(1)),
		Subject:               pkix.Name{CommonName: name},
		NotBefore:             time.Now().Add(-time.Hour),
		NotAfter:              time.Now().Add(24 * time.Hour),
		KeyUsage:              x509.KeyUsageCertSign | x509.KeyUsageDigitalSignature,
		BasicConstraintsValid: true,
		IsCA:                  true,
	}
	der, err := x509.CreateCertificate(rand.Reader, tmpl, tmpl, &key.PublicKey, key)
	if err != nil {
		t.Fatalf("tlstest: self-sign CA %s: %v", name, err)
	}
	cert, err := x509.ParseCertificate(der)
	if err != nil {
		t.Fatal(err)
	}
	dir := t.TempDir()
	ca := &CA{Name: name, Cert: cert, dir: dir, key: key, CertFile: filepath.Join(dir, "ca.pem")}
	writePEM(t, ca.CertFile, "CERTIFICATE", der)
	return ca
}

// Server issues a server certificate for 127.0.0.1, ::1 and localhost
// (and any extra DNS names), valid now; base names its files in the CA's
// directory.
func (ca *CA) Server(t testing.TB, base string, dnsNames ...string) Files {
	t.Helper()
	return ca.issue(t, base, x509.ExtKeyUsageServerAuth, time.Now().Add(24*time.Hour), append([]string{"localhost"}, dnsNames...))
}

// Client issues a client certificate with common name cn.
func (ca *CA) Client(t testing.TB, cn string) Files {
	t.Helper()
	return ca.issue(t, cn, x509.ExtKeyUsageClientAuth, time.Now().Add(24*time.Hour), nil)
}

// Expired issues a client certificate that expired an hour ago.
func (ca *CA) Expired(t testing.TB, cn string) Files {
	t.Helper()
	return ca.issue(t, cn+"-expired", x509.ExtKeyUsageClientAuth, time.Now().Add(-time.Hour), nil)
}

// ServerAndClient issues one certificate good for both ends (etcd members
// use theirs to serve and to dial their peers).
func (ca *CA) ServerAndClient(t testing.TB, base string) Files {
	t.Helper()
	return ca.issue(t, base, 0, time.Now().Add(24*time.Hour), []string{"localhost"})
}

func (ca *CA) issue(t testing.TB, base string, usage x509.ExtKeyUsage, notAfter time.Time, dnsNames []string) Files {
	key := newKey(t)
	serial := big.NewInt(serials.Add(1))
	tmpl := &x509.Certificate{
		SerialNumber: serial,
		Subject:      pkix.Name{CommonName: base},
		NotBefore:    time.Now().Add(-2 * time.Hour),
		NotAfter:     notAfter,
		KeyUsage:     x509.KeyUsageDigitalSignature,
		ExtKeyUsage:  []x509.ExtKeyUsage{x509.ExtKeyUsageServerAuth, x509.ExtKeyUsageClientAuth},
	}
	if usage != 0 {
		tmpl.ExtKeyUsage = []x509.ExtKeyUsage{usage}
	}
	if dnsNames != nil {
		tmpl.DNSNames = dnsNames
		tmpl.IPAddresses = []net.IP{net.IPv4(127, 0, 0, 1), net.IPv6loopback}
	}
	der, err := x509.CreateCertificate(rand.Reader, tmpl, ca.Cert, &key.PublicKey, ca.key)
	if err != nil {
		t.Fatalf("tlstest: issue %s: %v", base, err)
	}
	kder, err := x509.MarshalECPrivateKey(key)
	if err != nil {
		t.Fatal(err)
	}
	f := Files{CertFile: filepath.Join(ca.dir, base+".pem"), KeyFile: filepath.Join(ca.dir, base+"-key.pem"), Serial: serial}
	writePEM(t, f.KeyFile, "EC PRIVATE KEY", kder)
	writePEM(t, f.CertFile, "CERTIFICATE", der)
	return f
}

// Pool is a pool holding only the CA's certificate.
func (ca *CA) Pool() *x509.CertPool {
	p := x509.NewCertPool()
	p.AddCert(ca.Cert)
	return p
}

// ClientConfig is a TLS client configuration trusting only ca, presenting
// client if it is not nil, whichever CAs the server says it accepts (Go's
// client would otherwise send nothing rather than a certificate of a CA
// the server did not list).
func ClientConfig(t testing.TB, ca *CA, client *Files) *tls.Config {
	t.Helper()
	cfg := &tls.Config{RootCAs: ca.Pool(), MinVersion: tls.VersionTLS12}
	if client != nil {
		pair, err := tls.LoadX509KeyPair(client.CertFile, client.KeyFile)
		if err != nil {
			t.Fatal(err)
		}
		cfg.GetClientCertificate = func(*tls.CertificateRequestInfo) (*tls.Certificate, error) { return &pair, nil }
	}
	return cfg
}

// Replace writes from's certificate and key over to's files, each by an
// atomic rename, the key first: a server reloading on change sees the
// old pair or the new one, or a key ahead of its certificate for a moment.
func Replace(t testing.TB, to, from Files) {
	t.Helper()
	for _, p := range [][2]string{{from.KeyFile, to.KeyFile}, {from.CertFile, to.CertFile}} {
		b, err := os.ReadFile(p[0])
		if err != nil {
			t.Fatal(err)
		}
		tmp := p[1] + ".tmp"
		if err := os.WriteFile(tmp, b, 0o600); err != nil {
			t.Fatal(err)
		}
		if err := os.Rename(tmp, p[1]); err != nil {
			t.Fatal(err)
		}
	}
}

func newKey(t testing.TB) *ecdsa.PrivateKey {
	key, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		t.Fatal(err)
	}
	return key
}

func writePEM(t testing.TB, path, typ string, der []byte) {
	if err := os.WriteFile(path, pem.EncodeToMemory(&pem.Block{Type: typ, Bytes: der}), 0o600); err != nil {
		t.Fatalf("tlstest: write %s: %v", path, err)
	}
}
