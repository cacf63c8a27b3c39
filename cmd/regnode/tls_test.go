package main_test

import (
	"context"
	"fmt"
	"io"
	"net/http"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials"
	"google.golang.org/protobuf/types/known/durationpb"

	"github.com/regcluster/registry/internal/etcdtest"
	"github.com/regcluster/registry/internal/tlstest"
	registryv1 "github.com/regcluster/registry/proto/registry/v1"
)

// Every TLS flag, given as a flag or as REGNODE_*: the API and metrics
// serve mTLS, the embedded member's client port and peer port serve TLS
// and the regnode reaches its member with its --etcd-cert.
func TestTLSFlags(t *testing.T) {
	ca := tlstest.NewCA(t, "ca")
	api := ca.Server(t, "api")
	member := ca.ServerAndClient(t, "member")
	me := ca.Client(t, "regnode")
	alice := ca.Client(t, "alice")
	apiAddr := fmt.Sprintf("127.0.0.1:%d", etcdtest.FreePort(t))
	metrics := fmt.Sprintf("127.0.0.1:%d", etcdtest.FreePort(t))
	p := start(t, map[string]string{
		"REGNODE_TRUSTED_CA_FILE":  ca.CertFile,
		"REGNODE_CLIENT_CERT_AUTH": "true",
		"REGNODE_ETCD_KEY":         me.KeyFile,
	},
		"--listen", apiAddr, "--metrics-listen", metrics, "--data-dir", t.TempDir(),
		"--cert-file", api.CertFile, "--key-file", api.KeyFile,
		"--listen-client-urls", fmt.Sprintf("https://127.0.0.1:%d", etcdtest.FreePort(t)),
		"--etcd-server-cert-file", member.CertFile, "--etcd-server-key-file", member.KeyFile,
		"--etcd-server-trusted-ca-file", ca.CertFile, "--etcd-server-client-cert-auth",
		"--listen-peer-urls", fmt.Sprintf("https://127.0.0.1:%d", etcdtest.FreePort(t)),
		"--peer-cert-file", member.CertFile, "--peer-key-file", member.KeyFile,
		"--peer-trusted-ca-file", ca.CertFile, "--peer-client-cert-auth",
		"--etcd-cacert", ca.CertFile, "--etcd-cert", me.CertFile,
	)
	cfg := tlstest.ClientConfig(t, ca, &alice)
	cc, err := grpc.NewClient(apiAddr, grpc.WithTransportCredentials(credentials.NewTLS(cfg)))
	if err != nil {
		t.Fatal(err)
	}
	defer cc.Close()
	waitServing(t, cc, p)
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	if _, err := registryv1.NewRegistryClient(cc).Register(ctx, &registryv1.RegisterRequest{
		Instance: &registryv1.Instance{Service: "orders", Id: "o-1", Address: "10.0.0.1:80"}, Ttl: durationpb.New(time.Minute)}); err != nil {
		t.Fatalf("Register over mTLS: %v; stderr:\n%s", err, p.stderr)
	}
	if _, err := registryv1.NewRegistryClient(dial(t, apiAddr)).Status(ctx, &registryv1.StatusRequest{}); err == nil {
		t.Fatal("a plaintext client was served")
	}
	hc := &http.Client{Transport: &http.Transport{TLSClientConfig: cfg}}
	defer hc.CloseIdleConnections()
	resp, err := hc.Get("https://" + metrics + "/metrics")
	if err != nil {
		t.Fatalf("metrics over HTTPS: %v", err)
	}
	body, _ := io.ReadAll(resp.Body)
	resp.Body.Close()
	if !strings.Contains(string(body), "registry_registrations_total 1") {
		t.Fatalf("/metrics over HTTPS lacks registry_registrations_total 1:\n%.1000s", body)
	}
}

// Security settings that cannot be right are usage errors (exit 2) that
// say what to do, and nothing is written.
func TestInsecureOrIncompleteSecurityExits2(t *testing.T) {
	pw := filepath.Join(t.TempDir(), "pw")
	if err := os.WriteFile(pw, []byte("s3cret\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	for _, tc := range []struct {
		name string
		env  map[string]string
		args []string
		want string
	}{
		{"plaintext on all interfaces", nil, []string{"--listen", "0.0.0.0:0"}, "--listen 0.0.0.0:0 is not a loopback address and would serve without TLS"},
		{"plaintext metrics off-host", map[string]string{"REGNODE_METRICS_LISTEN": ":0"}, nil, "pass --insecure to serve plaintext anyway"},
		{"etcd client port off-host", nil, []string{"--listen-client-urls", "http://0.0.0.0:2379"}, "--etcd-server-cert-file"},
		{"cert without key", nil, []string{"--cert-file", "c.pem"}, "--cert-file and --key-file go together"},
		{"client cert auth without CA", nil, []string{"--cert-file", "c.pem", "--key-file", "k.pem", "--client-cert-auth"}, "--client-cert-auth needs --trusted-ca-file"},
		{"username without password", nil, []string{"--etcd-username", "root"}, "--etcd-username needs a password"},
		{"password twice", map[string]string{"REGNODE_ETCD_PASSWORD": "x"}, []string{"--etcd-username", "root", "--etcd-password-file", pw}, "given twice"},
		{"etcd-server-auth with an external etcd", nil, []string{"--etcd-server-auth", "--etcd-endpoints", "http://127.0.0.1:1"}, "--etcd-server-auth is for the embedded member"},
		{"https member without a certificate", nil, []string{"--listen-client-urls", "https://127.0.0.1:2379"}, "needs --etcd-server-cert-file"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			data := filepath.Join(t.TempDir(), "data")
			p := start(t, tc.env, append([]string{"--data-dir", data}, tc.args...)...)
			if code := p.wait(t, 20*time.Second); code != 2 {
				t.Fatalf("exit %d, want 2; stderr:\n%s", code, p.stderr)
			}
			if !strings.Contains(p.stderr.String(), tc.want) {
				t.Fatalf("stderr does not say %q:\n%s", tc.want, p.stderr)
			}
			if _, err := os.Stat(data); !os.IsNotExist(err) {
				t.Fatalf("data dir written: %v", err)
			}
		})
	}
}
