// Package tlsfiles builds TLS configurations from PEM files named on a
// command line, with etcd's meanings, and keeps them current: a server's
// certificate, key and trusted CA, and a client's certificate and key, are
// re-read when their files change, with no restart and without touching
// connections already made.
//
// A change is noticed on the next handshake, by stat(2) of the files
// (modification time and size), not by a file watcher: a stat per
// handshake costs next to nothing (regnode's connections are long-lived
// gRPC ones), needs no goroutine or inotify descriptor to own, and sees
// every way a file is replaced (rewritten in place, renamed over, a
// Kubernetes secret's symlink swapped), where a watch on a file misses a
// rename over it. A pair that does not load (the certificate written
// before its key, a half-written file) is reported once and the last good
// one goes on being served until the files load again.
package tlsfiles

import (
	"crypto/tls"
	"crypto/x509"
	"errors"
	"fmt"
	"log/slog"
	"os"
	"sync"
)

// Server names a TLS server's files (etcd's --cert-file, --key-file,
// --trusted-ca-file, --client-cert-auth).
type Server struct {
	// CertFile and KeyFile are the server's certificate and key; set both
	// or neither. Empty: the listener is plaintext.
	CertFile, KeyFile string
	// TrustedCAFile, if set, is the CA bundle client certificates must
	// chain to. As in etcd, setting it requires a client certificate.
	TrustedCAFile string
	// ClientCertAuth requires every client to present a certificate of
	// TrustedCAFile (which it needs).
	ClientCertAuth bool
}

// Enabled reports whether the listener serves TLS.
func (s Server) Enabled() bool { return s.CertFile != "" || s.KeyFile != "" }

// Validate reports settings that cannot work; flag is the prefix of the
// flag names in messages ("" for --cert-file..., "peer-" for
// --peer-cert-file...).
func (s Server) Validate(flag string) error {
	if (s.CertFile == "") != (s.KeyFile == "") {
		return fmt.Errorf("--%scert-file and --%skey-file go together: set both or neither", flag, flag)
	}
	if s.ClientCertAuth && s.TrustedCAFile == "" {
		return fmt.Errorf("--%sclient-cert-auth needs --%strusted-ca-file to check client certificates against", flag, flag)
	}
	if s.TrustedCAFile != "" && s.CertFile == "" {
		return fmt.Errorf("--%strusted-ca-file needs --%scert-file and --%skey-file (client certificates are only asked over TLS)", flag, flag, flag)
	}
	return nil
}

// Client names a TLS client's files (etcdctl's --cacert, --cert, --key).
type Client struct {
	// CAFile is the CA bundle the server's certificate must chain to
	// (empty: the system's roots).
	CAFile string
	// CertFile and KeyFile are the client certificate presented when the
	// server asks for one; set both or neither.
	CertFile, KeyFile string
}

// Enabled reports whether any file is named, which turns TLS on.
func (c Client) Enabled() bool { return c.CAFile != "" || c.CertFile != "" || c.KeyFile != "" }

// Validate reports settings that cannot work; certFlag and keyFlag name
// CertFile and KeyFile in messages.
func (c Client) Validate(certFlag, keyFlag string) error {
	if (c.CertFile == "") != (c.KeyFile == "") {
		return fmt.Errorf("%s and %s go together: set both or neither", certFlag, keyFlag)
	}
	return nil
}

// Config returns a client configuration: the CA is read now, the key pair
// now and again whenever its files change. logger hears of a pair that
// stopped loading (nil: slog.Default()).
func (c Client) Config(logger *slog.Logger) (*tls.Config, error) {
	cfg := &tls.Config{MinVersion: tls.VersionTLS12}
	if c.CAFile != "" {
		pool, err := loadPool(c.CAFile)
		if err != nil {
			return nil, err
		}
		cfg.RootCAs = pool
	}
	if c.CertFile != "" {
		kp, err := newKeyPair(c.CertFile, c.KeyFile, logger)
		if err != nil {
			return nil, err
		}
		cfg.GetClientCertificate = func(*tls.CertificateRequestInfo) (*tls.Certificate, error) {
			return kp.get(), nil
		}
	}
	return cfg, nil
}

// ServerConfig returns a server configuration that serves s's files as
// they are at each handshake. It fails if they do not load now.
func ServerConfig(s Server, logger *slog.Logger) (*tls.Config, error) {
	if err := s.Validate(""); err != nil {
		return nil, err
	}
	if logger == nil {
		logger = slog.Default()
	}
	kp, err := newKeyPair(s.CertFile, s.KeyFile, logger)
	if err != nil {
		return nil, err
	}
	r := &serverReloader{files: s, kp: kp, log: logger}
	if s.TrustedCAFile != "" {
		if r.pool, err = loadPool(s.TrustedCAFile); err != nil {
			return nil, err
		}
		r.caStamp, _ = statOf(s.TrustedCAFile)
	}
	r.build()
	return &tls.Config{MinVersion: tls.VersionTLS12, GetConfigForClient: r.configForClient}, nil
}

// serverReloader hands each handshake the configuration of the files as
// they are now. The client CA pool is part of the configuration, so
// GetConfigForClient (not only GetCertificate) is what reloads it.
type serverReloader struct {
	files Server
	kp    *keyPair
	log   *slog.Logger

	mu        sync.Mutex
	pool      *x509.CertPool
	caStamp   stamp
	caFailed  stamp
	cfg       *tls.Config
	builtWith *tls.Certificate
}

func (r *serverReloader) build() {
	cfg := &tls.Config{MinVersion: tls.VersionTLS12, NextProtos: []string{"h2", "http/1.1"}}
	cert := r.kp.get()
	cfg.Certificates = []tls.Certificate{*cert}
	if r.pool != nil {
		cfg.ClientCAs = r.pool
		// etcd's meaning: a trusted CA file, or --client-cert-auth, asks
		// every client for a certificate of that CA.
		cfg.ClientAuth = tls.RequireAndVerifyClientCert
	}
	r.cfg, r.builtWith = cfg, cert
}

func (r *serverReloader) configForClient(*tls.ClientHelloInfo) (*tls.Config, error) {
	cert := r.kp.get()
	r.mu.Lock()
	defer r.mu.Unlock()
	changed := cert != r.builtWith
	if f := r.files.TrustedCAFile; f != "" {
		if st, err := statOf(f); err == nil && st != r.caStamp && st != r.caFailed {
			if pool, err := loadPool(f); err != nil {
				r.caFailed = st
				r.log.Warn("trusted CA file changed but does not load; still trusting the last good one", "file", f, "err", err)
			} else {
				r.pool, r.caStamp, changed = pool, st, true
				r.log.Info("trusted CA file reloaded", "file", f)
			}
		}
	}
	if changed {
		r.build()
	}
	return r.cfg, nil
}

// keyPair is a certificate and key re-read when either file changes.
type keyPair struct {
	certFile, keyFile string
	log               *slog.Logger

	mu     sync.Mutex
	cert   *tls.Certificate
	loaded [2]stamp // of the files cert came from
	failed [2]stamp // of files that did not load: not tried again
}

func newKeyPair(certFile, keyFile string, logger *slog.Logger) (*keyPair, error) {
	if logger == nil {
		logger = slog.Default()
	}
	kp := &keyPair{certFile: certFile, keyFile: keyFile, log: logger}
	st, err := kp.stamps()
	if err != nil {
		return nil, err
	}
	cert, err := tls.LoadX509KeyPair(certFile, keyFile)
	if err != nil {
		return nil, fmt.Errorf("load certificate %s and key %s: %w", certFile, keyFile, err)
	}
	kp.cert, kp.loaded = &cert, st
	return kp, nil
}

func (kp *keyPair) stamps() ([2]stamp, error) {
	c, err := statOf(kp.certFile)
	if err != nil {
		return [2]stamp{}, err
	}
	k, err := statOf(kp.keyFile)
	if err != nil {
		return [2]stamp{}, err
	}
	return [2]stamp{c, k}, nil
}

// get returns the current pair, reloading it first if its files changed.
// Files that vanished or do not load leave the last good pair in place.
func (kp *keyPair) get() *tls.Certificate {
	kp.mu.Lock()
	defer kp.mu.Unlock()
	st, err := kp.stamps()
	if err != nil || st == kp.loaded || st == kp.failed {
		return kp.cert
	}
	cert, err := tls.LoadX509KeyPair(kp.certFile, kp.keyFile)
	if err != nil {
		kp.failed = st
		kp.log.Warn("certificate files changed but do not load; still serving the last good pair",
			"cert_file", kp.certFile, "key_file", kp.keyFile, "err", err)
		return kp.cert
	}
	kp.cert, kp.loaded = &cert, st
	serial := ""
	if len(cert.Certificate) > 0 {
		if leaf, err := x509.ParseCertificate(cert.Certificate[0]); err == nil {
			serial = leaf.SerialNumber.Text(16)
		}
	}
	kp.log.Info("certificate reloaded", "cert_file", kp.certFile, "serial", serial)
	return kp.cert
}

// stamp is what tells a file changed.
type stamp struct {
	mod  int64 // ns since the epoch
	size int64
}

func statOf(path string) (stamp, error) {
	fi, err := os.Stat(path) // follows symlinks: a swapped link is a change
	if err != nil {
		return stamp{}, fmt.Errorf("read %s: %w", path, err)
	}
	return stamp{mod: fi.ModTime().UnixNano(), size: fi.Size()}, nil
}

// ErrNoCertificates is a CA file with no certificate in it.
var ErrNoCertificates = errors.New("no PEM certificate found")

func loadPool(path string) (*x509.CertPool, error) {
	b, err := os.ReadFile(path)
	if err != nil {
		return nil, fmt.Errorf("read CA file: %w", err)
	}
	pool := x509.NewCertPool()
	if !pool.AppendCertsFromPEM(b) {
		return nil, fmt.Errorf("CA file %s: %w", path, ErrNoCertificates)
	}
	return pool, nil
}
