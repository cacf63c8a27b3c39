package node_test

import (
	"context"
	"crypto/tls"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net/http"
	"os"
	"strings"
	"testing"
	"time"

	clientv3 "go.etcd.io/etcd/client/v3"
	"golang.org/x/crypto/bcrypt"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/credentials/insecure"
	"google.golang.org/grpc/status"

	"github.com/regcluster/registry/client"
	"github.com/regcluster/registry/internal/embedded"
	"github.com/regcluster/registry/internal/etcdtest"
	"github.com/regcluster/registry/internal/node"
	"github.com/regcluster/registry/internal/tlsfiles"
	"github.com/regcluster/registry/internal/tlstest"
	registryv1 "github.com/regcluster/registry/proto/registry/v1"
)

var quietLog = slog.New(slog.NewTextHandler(io.Discard, nil))

// startEmbedded runs a regnode embedding a fresh member on loopback,
// cfg's other settings as given; ports taken meanwhile are retried.
func startEmbedded(t *testing.T, cfg node.Config, clientScheme string) *node.Node {
	t.Helper()
	for attempt := 0; ; attempt++ {
		c := cfg
		c.Listen, c.MetricsListen, c.Logger, c.ShutdownGrace = "127.0.0.1:0", "127.0.0.1:0", quietLog, 200*time.Millisecond
		c.Embed.Name, c.Embed.Dir, c.Embed.UnsafeNoFsync, c.Embed.LogLevel = "rn", t.TempDir(), true, "error"
		c.Embed.BcryptCost = bcrypt.MinCost // authentication stays fast under -race
		c.Embed.ListenClientURLs = []string{fmt.Sprintf("%s://127.0.0.1:%d", clientScheme, etcdtest.FreePort(t))}
		c.Embed.ListenPeerURLs = []string{fmt.Sprintf("http://127.0.0.1:%d", etcdtest.FreePort(t))}
		ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
		n, err := node.Start(ctx, c)
		cancel()
		if err == nil {
			t.Cleanup(func() {
				if err := n.Close(); err != nil {
					t.Errorf("close regnode: %v", err)
				}
			})
			return n
		}
		if !etcdtest.AddrInUse(err) || attempt == 4 {
			t.Fatalf("start regnode: %v", err)
		}
	}
}

func sdk(t *testing.T, addr string, cfg *tls.Config) *client.Client {
	t.Helper()
	c, err := client.New(client.Config{Endpoints: []string{addr}, TLS: cfg, Logger: quietLog})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		if err := c.Close(); err != nil {
			t.Errorf("close client: %v", err)
		}
	})
	return c
}

func statusErr(c *client.Client) error {
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	_, err := c.API().Status(ctx, &registryv1.StatusRequest{})
	return err
}

// servedSerial is the serial of the certificate a new connection to addr
// is shown.
func servedSerial(t *testing.T, addr string, cfg *tls.Config) string {
	t.Helper()
	conn, err := tls.Dial("tcp", addr, cfg)
	if err != nil {
		t.Fatalf("TLS dial %s: %v", addr, err)
	}
	defer conn.Close()
	return conn.ConnectionState().PeerCertificates[0].SerialNumber.String()
}

// The API and the metrics port serve TLS: a plaintext client and a client
// of another CA are refused, a client of the CA works; a rotated
// certificate is shown to new connections while a Watch stream opened
// before goes on receiving.
func TestTLSListeners(t *testing.T) {
	ca := tlstest.NewCA(t, "regnode-ca")
	srv := ca.Server(t, "regnode")
	n := startEmbedded(t, node.Config{TLS: tlsfiles.Server{CertFile: srv.CertFile, KeyFile: srv.KeyFile}}, "http")

	plain, err := grpc.NewClient(n.Addr(), grpc.WithTransportCredentials(insecure.NewCredentials()))
	if err != nil {
		t.Fatal(err)
	}
	defer plain.Close()
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	_, err = registryv1.NewRegistryClient(plain).Status(ctx, &registryv1.StatusRequest{})
	cancel()
	if status.Code(err) != codes.Unavailable {
		t.Fatalf("plaintext Status: err = %v, want Unavailable", err)
	}
	other := tlstest.NewCA(t, "other-ca")
	if err := statusErr(sdk(t, n.Addr(), tlstest.ClientConfig(t, other, nil))); status.Code(err) != codes.Unavailable ||
		!strings.Contains(err.Error(), "certificate signed by unknown authority") {
		t.Fatalf("client of another CA: err = %v, want Unavailable naming the unknown authority", err)
	}
	good := sdk(t, n.Addr(), tlstest.ClientConfig(t, ca, nil))
	if err := statusErr(good); err != nil {
		t.Fatalf("client of the CA: %v", err)
	}

	// Metrics over HTTPS; plain HTTP gets the server's refusal.
	hc := &http.Client{Transport: &http.Transport{TLSClientConfig: tlstest.ClientConfig(t, ca, nil)}}
	defer hc.CloseIdleConnections()
	resp, err := hc.Get("https://" + n.MetricsAddr() + "/metrics")
	if err != nil {
		t.Fatalf("GET metrics over HTTPS: %v", err)
	}
	body, _ := io.ReadAll(resp.Body)
	resp.Body.Close()
	if resp.StatusCode != http.StatusOK || !strings.Contains(string(body), "registry_") {
		t.Fatalf("metrics over HTTPS: %s\n%.300s", resp.Status, body)
	}
	// The JSON API and the dashboard on the same port: the API's calls
	// reach the gRPC API in memory, past its TLS.
	for _, path := range []string{"/api/v1/status", "/"} {
		resp, err := hc.Get("https://" + n.MetricsAddr() + path)
		if err != nil {
			t.Fatalf("GET %s over HTTPS: %v", path, err)
		}
		body, _ := io.ReadAll(resp.Body)
		resp.Body.Close()
		if resp.StatusCode != http.StatusOK {
			t.Fatalf("GET %s over HTTPS: %s\n%.300s", path, resp.Status, body)
		}
	}
	if resp, err := http.Get("http://" + n.MetricsAddr() + "/metrics"); err == nil {
		resp.Body.Close()
		if resp.StatusCode != http.StatusBadRequest {
			t.Fatalf("plain HTTP to the metrics port: %s, want 400", resp.Status)
		}
	}

	// A Watch stream opened before the rotation.
	wctx, stopWatch := context.WithCancel(context.Background())
	defer stopWatch()
	w, err := good.API().Watch(wctx, &registryv1.WatchRequest{Service: "orders"})
	if err != nil {
		t.Fatal(err)
	}
	if m, err := w.Recv(); err != nil || m.GetSnapshot() == nil {
		t.Fatalf("first Watch message = %v, %v; want the snapshot", m, err)
	}
	if got := servedSerial(t, n.Addr(), tlstest.ClientConfig(t, ca, nil)); got != srv.Serial.String() {
		t.Fatalf("served serial %s, want %s", got, srv.Serial)
	}
	rotated := ca.Server(t, "regnode-2")
	tlstest.Replace(t, srv, rotated)
	if got := servedSerial(t, n.Addr(), tlstest.ClientConfig(t, ca, nil)); got != rotated.Serial.String() {
		t.Fatalf("after rotation the API serves serial %s, want %s", got, rotated.Serial)
	}
	if got := servedSerial(t, n.MetricsAddr(), tlstest.ClientConfig(t, ca, nil)); got != rotated.Serial.String() {
		t.Fatalf("after rotation the metrics port serves serial %s, want %s", got, rotated.Serial)
	}
	// A new client registers; the old stream hears it.
	fresh := sdk(t, n.Addr(), tlstest.ClientConfig(t, ca, nil))
	rctx, rcancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer rcancel()
	if _, err := fresh.API().Register(rctx, &registryv1.RegisterRequest{Instance: &registryv1.Instance{Service: "orders", Id: "o-1", Address: "10.0.0.1:80"}}); err != nil {
		t.Fatalf("Register over a connection made after the rotation: %v", err)
	}
	for {
		m, err := w.Recv()
		if err != nil {
			t.Fatalf("the Watch stream opened before the rotation ended: %v", err)
		}
		if evs := m.GetEvents(); evs != nil && len(evs.Events) > 0 && evs.Events[0].Id == "o-1" {
			break
		}
	}
}

// With --client-cert-auth a client without a certificate, or with one of
// another CA, is refused; one with a certificate of the trusted CA works.
func TestClientCertAuth(t *testing.T) {
	ca := tlstest.NewCA(t, "regnode-ca")
	clients := tlstest.NewCA(t, "client-ca")
	other := tlstest.NewCA(t, "other-ca")
	srv := ca.Server(t, "regnode")
	n := startEmbedded(t, node.Config{TLS: tlsfiles.Server{CertFile: srv.CertFile, KeyFile: srv.KeyFile,
		TrustedCAFile: clients.CertFile, ClientCertAuth: true}}, "http")

	if err := statusErr(sdk(t, n.Addr(), tlstest.ClientConfig(t, ca, nil))); status.Code(err) != codes.Unavailable {
		t.Fatalf("client without a certificate: err = %v, want Unavailable", err)
	}
	stranger := other.Client(t, "stranger")
	if err := statusErr(sdk(t, n.Addr(), tlstest.ClientConfig(t, ca, &stranger))); status.Code(err) != codes.Unavailable {
		t.Fatalf("client with a certificate of another CA: err = %v, want Unavailable", err)
	}
	expired := clients.Expired(t, "late")
	if err := statusErr(sdk(t, n.Addr(), tlstest.ClientConfig(t, ca, &expired))); status.Code(err) != codes.Unavailable {
		t.Fatalf("client with an expired certificate: err = %v, want Unavailable", err)
	}
	alice := clients.Client(t, "alice")
	if err := statusErr(sdk(t, n.Addr(), tlstest.ClientConfig(t, ca, &alice))); err != nil {
		t.Fatalf("client with a certificate of the trusted CA: %v", err)
	}
	// The HTTP port asks for one too, and with one its JSON API reaches
	// the gRPC API (which the regnode calls in memory: it holds no client
	// certificate of the trusted CA).
	hcAlice := &http.Client{Transport: &http.Transport{TLSClientConfig: tlstest.ClientConfig(t, ca, &alice)}}
	defer hcAlice.CloseIdleConnections()
	resp, err := hcAlice.Get("https://" + n.MetricsAddr() + "/api/v1/status")
	if err != nil {
		t.Fatalf("JSON API with a client certificate: %v", err)
	}
	body, _ := io.ReadAll(resp.Body)
	resp.Body.Close()
	if resp.StatusCode != http.StatusOK {
		t.Fatalf("JSON API with a client certificate: %s\n%.300s", resp.Status, body)
	}
	hc := &http.Client{Transport: &http.Transport{TLSClientConfig: tlstest.ClientConfig(t, ca, nil)}}
	defer hc.CloseIdleConnections()
	if resp, err := hc.Get("https://" + n.MetricsAddr() + "/metrics"); err == nil {
		resp.Body.Close()
		t.Fatalf("metrics without a client certificate: %s, want refused", resp.Status)
	}
}

// A listener that anyone off this host could reach, serving plaintext, is
// refused unless Insecure says so; TLS, or a loopback address, is fine.
func TestInsecureListenerRefused(t *testing.T) {
	for _, tc := range []struct {
		name string
		cfg  func(*node.Config)
		flag string
	}{
		{"api", func(c *node.Config) { c.Listen = "0.0.0.0:7400" }, "--listen 0.0.0.0:7400"},
		{"api all interfaces", func(c *node.Config) { c.Listen = ":7400" }, "--listen :7400"},
		{"metrics", func(c *node.Config) { c.MetricsListen = "192.0.2.1:7401" }, "--metrics-listen 192.0.2.1:7401"},
		{"etcd client", func(c *node.Config) { c.Embed.ListenClientURLs = []string{"http://0.0.0.0:2379"} }, "--listen-client-urls http://0.0.0.0:2379"},
		{"etcd peer", func(c *node.Config) { c.Embed.ListenPeerURLs = []string{"http://10.1.2.3:2380"} }, "--listen-peer-urls http://10.1.2.3:2380"},
		// DNS has no TLS: a certificate for the API does not make it private.
		{"dns", func(c *node.Config) { c.DNS.Listen = "0.0.0.0:8600" }, "--dns-listen 0.0.0.0:8600"},
		{"dns beside TLS", func(c *node.Config) {
			c.DNS.Listen, c.TLS = "[::]:8600", tlsfiles.Server{CertFile: "c.pem", KeyFile: "k.pem"}
		}, "--dns-listen [::]:8600"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			cfg := node.DefaultConfig()
			tc.cfg(&cfg)
			err := cfg.Validate()
			if !errors.Is(err, node.ErrInsecureListener) || !strings.Contains(err.Error(), tc.flag) || !strings.Contains(err.Error(), "--insecure") {
				t.Fatalf("Validate = %v, want ErrInsecureListener naming %q and --insecure", err, tc.flag)
			}
			// Start refuses before it binds or writes anything.
			cfg.Embed.Dir = t.TempDir() + "/data"
			if _, err := node.Start(context.Background(), cfg); !errors.Is(err, node.ErrInsecureListener) {
				t.Fatalf("Start = %v, want ErrInsecureListener", err)
			}
			cfg.Insecure = true
			if err := cfg.Validate(); err != nil {
				t.Fatalf("with Insecure: %v", err)
			}
		})
	}
	cfg := node.DefaultConfig()
	cfg.Listen, cfg.MetricsListen = "0.0.0.0:7400", "[::]:7401"
	cfg.TLS = tlsfiles.Server{CertFile: "c.pem", KeyFile: "k.pem"}
	if err := cfg.Validate(); err != nil {
		t.Fatalf("non-loopback with TLS: %v", err)
	}
	cfg = node.DefaultConfig()
	cfg.Listen, cfg.MetricsListen, cfg.DNS.Listen = "localhost:7400", "[::1]:7401", "127.0.0.1:8600"
	if err := cfg.Validate(); err != nil {
		t.Fatalf("loopback without TLS: %v", err)
	}
}

// startTLSEtcd runs an etcd member whose client port serves TLS with the
// CA's certificate and requires client certificates of it.
func startTLSEtcd(t *testing.T, ca *tlstest.CA) string {
	t.Helper()
	srv := ca.Server(t, "etcd")
	for attempt := 0; ; attempt++ {
		cu := fmt.Sprintf("https://127.0.0.1:%d", etcdtest.FreePort(t))
		pu := fmt.Sprintf("http://127.0.0.1:%d", etcdtest.FreePort(t))
		ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
		e, err := embedded.Start(ctx, embedded.Config{Name: "tls", Dir: t.TempDir(), ListenClientURLs: []string{cu},
			ListenPeerURLs: []string{pu}, UnsafeNoFsync: true, LogLevel: "error", Logger: quietLog,
			ClientTLS: tlsfiles.Server{CertFile: srv.CertFile, KeyFile: srv.KeyFile, TrustedCAFile: ca.CertFile, ClientCertAuth: true}})
		cancel()
		if err == nil {
			t.Cleanup(e.Close)
			return cu
		}
		if !etcdtest.AddrInUse(err) || attempt == 4 {
			t.Fatalf("start etcd with TLS: %v", err)
		}
	}
}

func startExternal(t *testing.T, cfg node.Config) (*node.Node, error) {
	t.Helper()
	cfg.Listen, cfg.MetricsListen, cfg.Logger, cfg.ShutdownGrace = "127.0.0.1:0", "off", quietLog, 200*time.Millisecond
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	n, err := node.Start(ctx, cfg)
	if err == nil {
		t.Cleanup(func() {
			if err := n.Close(); err != nil {
				t.Errorf("close regnode: %v", err)
			}
		})
	}
	return n, err
}

// A regnode reaches an external etcd over TLS with a client certificate;
// with a wrong CA, or no client certificate, it fails at start saying
// what is wrong.
func TestExternalEtcdTLS(t *testing.T) {
	ca := tlstest.NewCA(t, "etcd-ca")
	url := startTLSEtcd(t, ca)
	me := ca.Client(t, "regnode")

	n, err := startExternal(t, node.Config{EtcdEndpoints: []string{url},
		EtcdTLS: tlsfiles.Client{CAFile: ca.CertFile, CertFile: me.CertFile, KeyFile: me.KeyFile}})
	if err != nil {
		t.Fatalf("regnode over TLS to etcd: %v", err)
	}
	api := sdk(t, n.Addr(), nil).API()
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	if _, err := api.Register(ctx, &registryv1.RegisterRequest{Instance: &registryv1.Instance{Service: "web", Id: "w-1", Address: "10.0.0.1:80"}}); err != nil {
		t.Fatal(err)
	}
	if g, err := api.Get(ctx, &registryv1.GetRequest{Service: "web", Id: "w-1"}); err != nil || g.Instance.Address != "10.0.0.1:80" {
		t.Fatalf("Get = %v, %v", g, err)
	}

	wrong := tlstest.NewCA(t, "wrong-ca")
	_, err = startExternal(t, node.Config{EtcdEndpoints: []string{url},
		EtcdTLS: tlsfiles.Client{CAFile: wrong.CertFile, CertFile: me.CertFile, KeyFile: me.KeyFile}})
	if err == nil || !strings.Contains(err.Error(), "TLS to etcd at") || !strings.Contains(err.Error(), "certificate signed by unknown authority") ||
		!strings.Contains(err.Error(), "--etcd-cacert") {
		t.Fatalf("wrong CA: err = %v, want the TLS failure named", err)
	}
	_, err = startExternal(t, node.Config{EtcdEndpoints: []string{url}, EtcdTLS: tlsfiles.Client{CAFile: ca.CertFile}})
	if err == nil || !strings.Contains(err.Error(), "TLS to etcd at") || !strings.Contains(err.Error(), "does it want a client certificate of its CA") {
		t.Fatalf("no client certificate: err = %v, want the refusal named", err)
	}
	_, err = startExternal(t, node.Config{EtcdEndpoints: []string{strings.Replace(url, "https", "http", 1)},
		EtcdTLS: tlsfiles.Client{CAFile: ca.CertFile}})
	if err == nil || !strings.Contains(err.Error(), "is plain http") {
		t.Fatalf("http endpoint with TLS files: err = %v, want refused", err)
	}
}

// A regnode authenticates to an etcd with auth on by user and password;
// a wrong password fails at start.
func TestExternalEtcdPassword(t *testing.T) {
	m := etcdtest.Start(t, false)
	root := m.Client(t)
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute) // bcrypt on a loaded machine is slow
	defer cancel()
	if _, err := root.UserAdd(ctx, "root", "s3cret"); err != nil {
		t.Fatal(err)
	}
	if _, err := root.UserGrantRole(ctx, "root", "root"); err != nil {
		t.Fatal(err)
	}
	if _, err := root.AuthEnable(ctx); err != nil {
		t.Fatal(err)
	}
	n, err := startExternal(t, node.Config{EtcdEndpoints: []string{m.ClientURL}, EtcdUsername: "root", EtcdPassword: "s3cret"})
	if err != nil {
		t.Fatalf("regnode with etcd credentials: %v", err)
	}
	if _, err := sdk(t, n.Addr(), nil).API().Register(ctx, &registryv1.RegisterRequest{Instance: &registryv1.Instance{Service: "web", Id: "w-1", Address: "10.0.0.1:80"}}); err != nil {
		t.Fatal(err)
	}
	_, err = startExternal(t, node.Config{EtcdEndpoints: []string{m.ClientURL}, EtcdUsername: "root", EtcdPassword: "guess"})
	if err == nil || !strings.Contains(err.Error(), "authentication failed") || strings.Contains(err.Error(), "guess") {
		t.Fatalf("wrong password: err = %v, want authentication failed, without the password", err)
	}
	_, err = startExternal(t, node.Config{EtcdEndpoints: []string{m.ClientURL}})
	if err == nil {
		t.Fatal("no credentials against an etcd with auth on: started")
	}
}

// An embedded member serving its client port over TLS with client
// certificates: the regnode reaches it with its --etcd-cert, a client
// without one does not.
func TestEmbeddedClientTLS(t *testing.T) {
	ca := tlstest.NewCA(t, "etcd-ca")
	srv := ca.Server(t, "member")
	me := ca.Client(t, "regnode")
	n := startEmbedded(t, node.Config{
		Embed:   embedded.Config{ClientTLS: tlsfiles.Server{CertFile: srv.CertFile, KeyFile: srv.KeyFile, TrustedCAFile: ca.CertFile, ClientCertAuth: true}},
		EtcdTLS: tlsfiles.Client{CAFile: ca.CertFile, CertFile: me.CertFile, KeyFile: me.KeyFile},
	}, "https")
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	if _, err := sdk(t, n.Addr(), nil).API().Register(ctx, &registryv1.RegisterRequest{Instance: &registryv1.Instance{Service: "web", Id: "w-1", Address: "10.0.0.1:80"}}); err != nil {
		t.Fatal(err)
	}
	member := n.Embedded().Clients[0].Addr().String()
	bare, err := clientv3.New(clientv3.Config{Endpoints: []string{"https://" + member}, DialTimeout: 2 * time.Second,
		TLS: tlstest.ClientConfig(t, ca, nil), Logger: etcdtest.QuietLogger()})
	if err != nil {
		t.Fatal(err)
	}
	defer bare.Close()
	gctx, gcancel := context.WithTimeout(context.Background(), 3*time.Second)
	defer gcancel()
	if _, err := bare.Get(gctx, "/", clientv3.WithPrefix()); err == nil {
		t.Fatal("an etcd client without a certificate read the embedded member")
	}
	_, err = startExternal(t, node.Config{EtcdEndpoints: []string{"https://" + member}, EtcdTLS: tlsfiles.Client{CAFile: ca.CertFile}})
	if err == nil || !strings.Contains(err.Error(), "does it want a client certificate of its CA") {
		t.Fatalf("a regnode without a client certificate: err = %v, want refused", err)
	}

	// etcd re-reads the member's certificate for each handshake.
	if got := servedSerial(t, member, tlstest.ClientConfig(t, ca, &me)); got != srv.Serial.String() {
		t.Fatalf("member serves serial %s, want %s", got, srv.Serial)
	}
	rotated := ca.Server(t, "member-2")
	tlstest.Replace(t, srv, rotated)
	if got := servedSerial(t, member, tlstest.ClientConfig(t, ca, &me)); got != rotated.Serial.String() {
		t.Fatalf("after rotation the member serves serial %s, want %s", got, rotated.Serial)
	}
	if _, err := sdk(t, n.Addr(), nil).API().Get(ctx, &registryv1.GetRequest{Service: "web", Id: "w-1"}); err != nil {
		t.Fatalf("Get after the member's certificate was rotated: %v", err)
	}
}

// Three embedded members talk to each other over mutual TLS: the cluster
// forms and a write through one regnode is read through another. A
// member whose peer certificate is of another CA does not join.
func TestPeerTLS(t *testing.T) {
	ca := tlstest.NewCA(t, "peer-ca")
	certs := map[string]tlstest.Files{}
	for _, n := range []string{"p1", "p2", "p3"} {
		certs[n] = ca.ServerAndClient(t, n)
	}
	peerTLS := func(name string) tlsfiles.Server {
		f := certs[name]
		return tlsfiles.Server{CertFile: f.CertFile, KeyFile: f.KeyFile, TrustedCAFile: ca.CertFile, ClientCertAuth: true}
	}
	var nodes []*node.Node
	for attempt := 0; nodes == nil; attempt++ {
		var err error
		nodes, err = startCluster(t, []string{"p1", "p2", "p3"}, peerTLS)
		if err != nil && (!etcdtest.AddrInUse(err) || attempt == 4) {
			t.Fatal(err)
		}
	}
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	if _, err := sdk(t, nodes[0].Addr(), nil).API().Register(ctx, &registryv1.RegisterRequest{Instance: &registryv1.Instance{Service: "web", Id: "w-1", Address: "10.0.0.1:80"}}); err != nil {
		t.Fatal(err)
	}
	if g, err := sdk(t, nodes[2].Addr(), nil).API().Get(ctx, &registryv1.GetRequest{Service: "web", Id: "w-1"}); err != nil || g.Instance.Address != "10.0.0.1:80" {
		t.Fatalf("Get through p3 = %v, %v", g, err)
	}

	// An intruder with a peer certificate of another CA cannot take part:
	// the cluster's members refuse its connections.
	other := tlstest.NewCA(t, "intruder-ca")
	bad := other.ServerAndClient(t, "intruder")
	st, err := sdk(t, nodes[0].Addr(), nil).API().Status(ctx, &registryv1.StatusRequest{})
	if err != nil {
		t.Fatal(err)
	}
	peer := ""
	for _, m := range st.Members {
		if m.Name == "p2" {
			peer = m.PeerUrls[0]
		}
	}
	hc := &http.Client{Transport: &http.Transport{TLSClientConfig: tlstest.ClientConfig(t, ca, &bad)}}
	defer hc.CloseIdleConnections()
	if resp, err := hc.Get(peer + "/members"); err == nil {
		resp.Body.Close()
		t.Fatalf("a peer certificate of another CA was served %s by %s", resp.Status, peer)
	}
	good := certs["p1"]
	hc2 := &http.Client{Transport: &http.Transport{TLSClientConfig: tlstest.ClientConfig(t, ca, &good)}}
	defer hc2.CloseIdleConnections()
	resp, err := hc2.Get(peer + "/members")
	if err != nil {
		t.Fatalf("a member's own peer certificate refused by %s: %v", peer, err)
	}
	resp.Body.Close()
}

// The start-up handshake that names a certificate problem asks for TLS
// 1.2 first; a server of TLS 1.3 only is not mistaken for one refusing
// our certificate. (This one is no etcd: start-up then fails at etcd's
// first answer, not at the handshake.)
func TestEtcdHandshakeTLS13Only(t *testing.T) {
	ca := tlstest.NewCA(t, "ca")
	srv := ca.Server(t, "tls13")
	pair, err := tls.LoadX509KeyPair(srv.CertFile, srv.KeyFile)
	if err != nil {
		t.Fatal(err)
	}
	l, err := tls.Listen("tcp", "127.0.0.1:0", &tls.Config{MinVersion: tls.VersionTLS13, Certificates: []tls.Certificate{pair}})
	if err != nil {
		t.Fatal(err)
	}
	handshakes := make(chan error, 16)
	done := make(chan struct{})
	go func() {
		defer close(done)
		for {
			c, err := l.Accept()
			if err != nil {
				return
			}
			select {
			case handshakes <- c.(*tls.Conn).Handshake():
			default:
			}
			c.Close()
		}
	}()
	defer func() { l.Close(); <-done }()
	_, err = startExternal(t, node.Config{EtcdEndpoints: []string{"https://" + l.Addr().String()}, EtcdTLS: tlsfiles.Client{CAFile: ca.CertFile}})
	if err == nil || strings.Contains(err.Error(), "TLS to etcd at") {
		t.Fatalf("a TLS 1.3 server: err = %v, want a failure past the handshake", err)
	}
	if err := <-handshakes; err == nil {
		t.Fatal("the first handshake, asking for TLS 1.2, succeeded against a TLS 1.3 server")
	}
	if err := <-handshakes; err != nil {
		t.Fatalf("the retried handshake failed: %v", err)
	}
}

// With EmbedAuth the embedded member's client port refuses a client
// without credentials; the regnode uses the root password it generated
// into the data dir (0600) on its first start, and again on the next; a
// password file others may read is refused.
func TestEmbeddedAuth(t *testing.T) {
	var cfg node.Config
	var n *node.Node
	for attempt := 0; n == nil; attempt++ {
		cfg = node.Config{Listen: "127.0.0.1:0", MetricsListen: "off", Logger: quietLog, ShutdownGrace: 200 * time.Millisecond,
			EmbedAuth: true, Embed: embedded.Config{Name: "auth", Dir: t.TempDir(), UnsafeNoFsync: true, LogLevel: "error", BcryptCost: bcrypt.MinCost,
				ListenClientURLs: []string{fmt.Sprintf("http://127.0.0.1:%d", etcdtest.FreePort(t))},
				ListenPeerURLs:   []string{fmt.Sprintf("http://127.0.0.1:%d", etcdtest.FreePort(t))}}}
		ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
		var err error
		n, err = node.Start(ctx, cfg)
		cancel()
		if err != nil && (!etcdtest.AddrInUse(err) || attempt == 4) {
			t.Fatalf("start regnode: %v", err)
		}
	}
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	c, err := client.New(client.Config{Endpoints: []string{n.Addr()}, Logger: quietLog})
	if err != nil {
		t.Fatal(err)
	}
	if _, err := c.API().Register(ctx, &registryv1.RegisterRequest{Instance: &registryv1.Instance{Service: "web", Id: "w-1", Address: "10.0.0.1:80"}}); err != nil {
		t.Fatal(err)
	}
	c.Close()

	file := cfg.Embed.Dir + "/" + node.RootPasswordFile
	fi, err := os.Stat(file)
	if err != nil || fi.Mode().Perm() != 0o600 {
		t.Fatalf("root password file: %v, %v; want mode 600", fi, err)
	}
	pw, err := os.ReadFile(file)
	if err != nil {
		t.Fatal(err)
	}
	url := cfg.Embed.ListenClientURLs[0]
	etcdGet := func(user, password string) (int64, error) {
		cli, err := clientv3.New(clientv3.Config{Endpoints: []string{url}, DialTimeout: 15 * time.Second,
			Username: user, Password: password, Logger: etcdtest.QuietLogger()})
		if err != nil {
			return 0, err
		}
		defer cli.Close()
		r, err := cli.Get(ctx, "/registry/", clientv3.WithPrefix(), clientv3.WithCountOnly())
		if err != nil {
			return 0, err
		}
		return r.Count, nil
	}
	if _, err := etcdGet("", ""); err == nil || !strings.Contains(err.Error(), "user name is empty") {
		t.Fatalf("etcd client without credentials: err = %v, want refused", err)
	}
	if _, err := etcdGet("root", "guess"); err == nil || !strings.Contains(err.Error(), "authentication failed") {
		t.Fatalf("etcd client with a guessed password: err = %v, want refused", err)
	}
	if k, err := etcdGet("root", strings.TrimSpace(string(pw))); err != nil || k == 0 {
		t.Fatalf("etcd client with the generated root password: %d keys, %v", k, err)
	}
	if err := n.Close(); err != nil {
		t.Fatal(err)
	}

	// The next start uses the same password.
	sctx, scancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer scancel()
	n2, err := node.Start(sctx, cfg)
	if err != nil {
		t.Fatalf("restart with auth on: %v", err)
	}
	if err := n2.Close(); err != nil {
		t.Fatal(err)
	}
	if again, _ := os.ReadFile(file); string(again) != string(pw) {
		t.Fatal("the root password changed on restart")
	}
	if err := os.Chmod(file, 0o644); err != nil {
		t.Fatal(err)
	}
	if _, err := node.Start(sctx, cfg); err == nil || !strings.Contains(err.Error(), "chmod 600") {
		t.Fatalf("start with a readable password file: err = %v, want refused", err)
	}
}

// EmbedAuth with a credential of the operator's (the one to give every
// regnode of a cluster): that user holds etcd's root role, no password
// file is written, and a client without credentials is refused.
func TestEmbeddedAuthGivenCredential(t *testing.T) {
	n := startEmbedded(t, node.Config{EmbedAuth: true, EtcdUsername: "registry", EtcdPassword: "shared-secret"}, "http")
	dir := n.Embedded().Config().Dir
	if _, err := os.Stat(dir + "/" + node.RootPasswordFile); !os.IsNotExist(err) {
		t.Fatalf("a password file was written with a credential given: %v", err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	url := "http://" + n.Embedded().Clients[0].Addr().String()
	for _, tc := range []struct {
		user, password string
		ok             bool
	}{{"", "", false}, {"registry", "shared-secret", true}} {
		cli, err := clientv3.New(clientv3.Config{Endpoints: []string{url}, DialTimeout: 15 * time.Second,
			Username: tc.user, Password: tc.password, Logger: etcdtest.QuietLogger()})
		if err == nil {
			_, err = cli.Put(ctx, "/elsewhere", "x")
			cli.Close()
		}
		if (err == nil) != tc.ok {
			t.Fatalf("etcd Put as %q: err = %v, want ok=%v", tc.user, err, tc.ok)
		}
	}
}

// Three embedded members started together with EmbedAuth and no
// credential of the operator's come up with etcd auth on at every member:
// each regnode is an etcd user of its own (regnode-<name>, root role)
// with its own generated password (0600), so none is locked out by
// another turning auth on first; anonymous clients are refused
// everywhere, and the regnodes serve.
func TestEmbeddedAuthThreeMembers(t *testing.T) {
	names := []string{"a1", "a2", "a3"}
	var nodes []*node.Node
	for attempt := 0; nodes == nil; attempt++ {
		var err error
		nodes, err = startClusterWith(t, names, nil, func(c *node.Config) {
			c.EmbedAuth = true
			c.Embed.BcryptCost = bcrypt.MinCost
		})
		if err != nil && (!etcdtest.AddrInUse(err) || attempt == 4) {
			t.Fatal(err)
		}
	}
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	passwords := map[string]bool{}
	for i, n := range nodes {
		url := "http://" + n.Embedded().Clients[0].Addr().String()
		anon, err := clientv3.New(clientv3.Config{Endpoints: []string{url}, DialTimeout: 15 * time.Second, Logger: etcdtest.QuietLogger()})
		if err != nil {
			t.Fatal(err)
		}
		_, err = anon.Put(ctx, "/elsewhere", "x")
		anon.Close()
		if err == nil || !strings.Contains(err.Error(), "user name is empty") {
			t.Fatalf("anonymous Put at %s: err = %v, want refused", names[i], err)
		}
		file := n.Embedded().Config().Dir + "/" + node.RootPasswordFile
		fi, err := os.Stat(file)
		if err != nil || fi.Mode().Perm() != 0o600 {
			t.Fatalf("%s's password file: %v, %v; want mode 600", names[i], fi, err)
		}
		pw, _ := os.ReadFile(file)
		passwords[string(pw)] = true
		own, err := clientv3.New(clientv3.Config{Endpoints: []string{url}, DialTimeout: 15 * time.Second,
			Username: "regnode-" + names[i], Password: strings.TrimSpace(string(pw)), Logger: etcdtest.QuietLogger()})
		if err != nil {
			t.Fatalf("etcd client as regnode-%s: %v", names[i], err)
		}
		_, err = own.Get(ctx, "/registry/", clientv3.WithPrefix(), clientv3.WithCountOnly())
		own.Close()
		if err != nil {
			t.Fatalf("Get as regnode-%s: %v", names[i], err)
		}
	}
	if len(passwords) != 3 {
		t.Errorf("%d distinct generated passwords, want one per member", len(passwords))
	}
	r1, err := client.New(client.Config{Endpoints: []string{nodes[0].Addr()}, Logger: quietLog})
	if err != nil {
		t.Fatal(err)
	}
	defer r1.Close()
	reg, err := r1.API().Register(ctx, &registryv1.RegisterRequest{Instance: &registryv1.Instance{Service: "web", Id: "w-1", Address: "10.0.0.1:80"}})
	if err != nil {
		t.Fatal(err)
	}
	r3, err := client.New(client.Config{Endpoints: []string{nodes[2].Addr()}, Logger: quietLog})
	if err != nil {
		t.Fatal(err)
	}
	defer r3.Close()
	if g, err := r3.API().Get(ctx, &registryv1.GetRequest{Service: "web", Id: "w-1"}); err != nil || g.Instance.LeaseId != reg.LeaseId {
		t.Fatalf("Get through a3: %v, %v", g, err)
	}
}
