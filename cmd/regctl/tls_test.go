package main

import (
	"testing"

	"github.com/regcluster/registry/internal/etcdtest"
	"github.com/regcluster/registry/internal/node"
	"github.com/regcluster/registry/internal/regnodetest"
	"github.com/regcluster/registry/internal/tlsfiles"
	"github.com/regcluster/registry/internal/tlstest"
)

// regctl speaks TLS with --cacert (or $REGCTL_CACERT) and presents
// --cert/--key (or $REGCTL_CERT/$REGCTL_KEY) to a regnode that asks for
// a client certificate; without them it is refused, saying why.
func TestTLS(t *testing.T) {
	ca := tlstest.NewCA(t, "regnode-ca")
	clients := tlstest.NewCA(t, "client-ca")
	srv := ca.Server(t, "regnode")
	m := etcdtest.Start(t, false)
	plainTLS := regnodetest.StartWith(t, node.Config{EtcdEndpoints: []string{m.ClientURL},
		TLS: tlsfiles.Server{CertFile: srv.CertFile, KeyFile: srv.KeyFile}}, m.ClientURL)
	mtls := regnodetest.StartWith(t, node.Config{EtcdEndpoints: []string{m.ClientURL},
		TLS: tlsfiles.Server{CertFile: srv.CertFile, KeyFile: srv.KeyFile, TrustedCAFile: clients.CertFile, ClientCertAuth: true}}, m.ClientURL)
	alice := clients.Client(t, "alice")

	mustFail(t, regctl(t, nil, "--endpoints", plainTLS.Addr, "services"), 1, "cannot reach a regnode at "+plainTLS.Addr)
	mustOK(t, regctl(t, nil, "--endpoints", plainTLS.Addr, "--cacert", ca.CertFile, "services"))
	mustOK(t, regctl(t, environ("REGCTL_CACERT="+ca.CertFile), "--endpoints", plainTLS.Addr, "services"))
	mustFail(t, regctl(t, nil, "--endpoints", plainTLS.Addr, "--cacert", clients.CertFile, "services"), 1, "certificate signed by unknown authority")

	// In TLS 1.3 the refusal of a missing client certificate comes after
	// the client's handshake: the client sees an alert or a broken pipe.
	mustFail(t, regctl(t, nil, "--endpoints", mtls.Addr, "--cacert", ca.CertFile, "services"), 1, "cannot reach a regnode at "+mtls.Addr)
	mustOK(t, regctl(t, nil, "--endpoints", mtls.Addr, "--cacert", ca.CertFile, "--cert", alice.CertFile, "--key", alice.KeyFile, "services"))
	mustOK(t, regctl(t, environ("REGCTL_CACERT="+ca.CertFile, "REGCTL_CERT="+alice.CertFile, "REGCTL_KEY="+alice.KeyFile),
		"--endpoints", mtls.Addr, "services"))

	mustFail(t, regctl(t, nil, "--endpoints", mtls.Addr, "--cacert", ca.CertFile, "--cert", alice.CertFile, "services"), 2, "--cert and --key go together")
	mustFail(t, regctl(t, nil, "--endpoints", mtls.Addr, "--cacert", t.TempDir()+"/none.pem", "services"), 1, "none.pem")
}
