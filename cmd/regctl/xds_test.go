package main

import (
	"context"
	"encoding/json"
	"fmt"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"

	bootstrapv3 "github.com/envoyproxy/go-control-plane/envoy/config/bootstrap/v3"
	_ "github.com/envoyproxy/go-control-plane/envoy/extensions/transport_sockets/tls/v3" // types of the bootstrap's Any fields
	_ "github.com/envoyproxy/go-control-plane/envoy/extensions/upstreams/http/v3"
	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials/insecure"
	"google.golang.org/grpc/health"
	healthpb "google.golang.org/grpc/health/grpc_health_v1"
	"google.golang.org/protobuf/encoding/protojson"

	_ "google.golang.org/grpc/xds" // the xds:/// resolver, for xdsChild

	"github.com/regcluster/registry/internal/etcdtest"
	"github.com/regcluster/registry/internal/node"
	"github.com/regcluster/registry/internal/regnodetest"
	"github.com/regcluster/registry/internal/tlsfiles"
	"github.com/regcluster/registry/internal/tlstest"
	registryv1 "github.com/regcluster/registry/proto/registry/v1"
)

// xdsChildEnv, set to a service name, makes the test binary grpc-go's
// own xDS client of xds:///SERVICE (xdsChild), configured by nothing but
// the file $GRPC_XDS_BOOTSTRAP names, instead of the tests.
const xdsChildEnv = "REGCTL_TEST_XDS_CHILD"

// xdsChildTimeoutEnv bounds the child's call (a Go duration).
const xdsChildTimeoutEnv = "REGCTL_TEST_XDS_TIMEOUT"

// xdsChild makes one health check through xds:///service and exits 0 when
// it succeeded, else 1 with the error on stderr.
func xdsChild(service string) int {
	cc, err := grpc.NewClient("xds:///"+service, grpc.WithTransportCredentials(insecure.NewCredentials()))
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		return 1
	}
	defer cc.Close()
	d, err := time.ParseDuration(os.Getenv(xdsChildTimeoutEnv))
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		return 1
	}
	ctx, cancel := context.WithTimeout(context.Background(), d)
	defer cancel()
	if _, err := healthpb.NewHealthClient(cc).Check(ctx, &healthpb.HealthCheckRequest{}, grpc.WaitForReady(true)); err != nil {
		fmt.Fprintln(os.Stderr, err)
		return 1
	}
	fmt.Println("ok")
	return 0
}

// healthBackend is a real gRPC server with the health service, stopped
// when the test ends.
func healthBackend(t *testing.T) string {
	t.Helper()
	lis, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	srv := grpc.NewServer()
	healthpb.RegisterHealthServer(srv, health.NewServer())
	go srv.Serve(lis)
	t.Cleanup(srv.Stop)
	return lis.Addr().String()
}

// callThroughBootstrap writes boot to a file and runs xdsChild on it,
// its call bounded by timeout.
func callThroughBootstrap(t *testing.T, boot, service, timeout string) (string, error) {
	t.Helper()
	path := filepath.Join(t.TempDir(), "bootstrap.json")
	if err := os.WriteFile(path, []byte(boot), 0o600); err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	cmd := exec.CommandContext(ctx, os.Args[0], "-test.run=^$")
	cmd.Env = append(os.Environ(), xdsChildEnv+"="+service, xdsChildTimeoutEnv+"="+timeout, "GRPC_XDS_BOOTSTRAP="+path)
	out, err := cmd.CombinedOutput()
	return string(out), err
}

// The bootstrap regctl prints is one grpc-go's xDS client runs on: a child
// process given nothing else calls xds:///orders through a real regnode
// to a real backend, in plaintext and over mTLS (--cacert, --cert, --key
// become "tls" channel credentials). Without the client certificate the
// mTLS regnode refuses the xDS stream and the call fails.
func TestXDSBootstrapDrivesGRPC(t *testing.T) {
	ca := tlstest.NewCA(t, "regnode-ca")
	clients := tlstest.NewCA(t, "client-ca")
	srv := ca.Server(t, "regnode")
	alice := clients.Client(t, "alice")
	m := etcdtest.Start(t, false)
	plain := regnodetest.StartExternal(t, m.ClientURL)
	mtls := regnodetest.StartWith(t, node.Config{EtcdEndpoints: []string{m.ClientURL},
		TLS: tlsfiles.Server{CertFile: srv.CertFile, KeyFile: srv.KeyFile, TrustedCAFile: clients.CertFile, ClientCertAuth: true}}, m.ClientURL)
	seed(t, apiClient(t, plain.Addr), &registryv1.Instance{Service: "orders", Id: "a", Address: healthBackend(t)})

	for _, tc := range []struct {
		name  string
		args  []string
		creds string
	}{
		{"plaintext", []string{"--endpoints", plain.Addr}, `"type": "insecure"`},
		{"mTLS", []string{"--endpoints", mtls.Addr, "--cacert", ca.CertFile, "--cert", alice.CertFile, "--key", alice.KeyFile}, `"type": "tls"`},
	} {
		t.Run(tc.name, func(t *testing.T) {
			r := mustOK(t, regctl(t, nil, append(tc.args, "xds", "bootstrap", "--zone", "eu-1", "--node-id", "t-"+tc.name)...))
			if !strings.Contains(r.stdout, tc.creds) {
				t.Fatalf("want %s in the bootstrap; %v", tc.creds, r)
			}
			if out, err := callThroughBootstrap(t, r.stdout, "orders", "30s"); err != nil || !strings.Contains(out, "ok") {
				t.Fatalf("xds:///orders through regctl's bootstrap: %v\n%s\nbootstrap: %s", err, out, r.stdout)
			}
		})
	}

	// The client certificate is what lets the xDS client in.
	r := mustOK(t, regctl(t, nil, "--endpoints", mtls.Addr, "--cacert", ca.CertFile, "xds", "bootstrap"))
	if out, err := callThroughBootstrap(t, r.stdout, "orders", "5s"); err == nil {
		t.Fatalf("an xDS client without a client certificate called through the mTLS regnode: %s\nbootstrap: %s", out, r.stdout)
	}
}

// bootstrapOf runs regctl xds bootstrap in-process and decodes its JSON.
func bootstrapOf(t *testing.T, args ...string) (map[string]any, string) {
	t.Helper()
	code, stdout, stderr := runLocal(append([]string{"xds", "bootstrap"}, args...)...)
	if code != 0 || stderr != "" {
		t.Fatalf("regctl %q xds bootstrap: exit %d, stderr %q", args, code, stderr)
	}
	var v map[string]any
	if err := json.Unmarshal([]byte(stdout), &v); err != nil {
		t.Fatalf("not JSON: %v\n%s", err, stdout)
	}
	return v, stdout
}

// at walks v along keys (a string for an object's field, an int for an
// array's element).
func at(t *testing.T, v any, path ...any) any {
	t.Helper()
	for _, k := range path {
		switch k := k.(type) {
		case string:
			m, ok := v.(map[string]any)
			if !ok {
				t.Fatalf("%v: not an object at %q", path, k)
			}
			v = m[k]
		case int:
			a, ok := v.([]any)
			if !ok || k >= len(a) {
				t.Fatalf("%v: no element %d", path, k)
			}
			v = a[k]
		}
	}
	return v
}

// The gRPC bootstrap: one xds_servers entry per endpoint, in order, each
// xds_v3; the node's id and zone as given, a default id otherwise; with
// --cacert (or $REGCTL_CACERT) "tls" creds naming the files by absolute
// path.
func TestXDSBootstrapGRPCFields(t *testing.T) {
	v, _ := bootstrapOf(t, "--endpoints", "10.0.0.1:7400,regnode-b:7401", "--zone", "eu-1", "--node-id", "orders-1")
	servers := at(t, v, "xds_servers").([]any)
	if len(servers) != 2 || at(t, servers, 0, "server_uri") != "10.0.0.1:7400" || at(t, servers, 1, "server_uri") != "regnode-b:7401" {
		t.Fatalf("xds_servers %v", servers)
	}
	for i := range servers {
		if at(t, servers, i, "channel_creds", 0, "type") != "insecure" || at(t, servers, i, "server_features", 0) != "xds_v3" {
			t.Fatalf("xds_servers[%d] = %v", i, servers[i])
		}
	}
	if at(t, v, "node", "id") != "orders-1" || at(t, v, "node", "locality", "zone") != "eu-1" {
		t.Fatalf("node %v", at(t, v, "node"))
	}

	v, _ = bootstrapOf(t)
	host, _ := os.Hostname()
	if id, _ := at(t, v, "node", "id").(string); !strings.HasPrefix(id, host+"-") || len(id) != len(host)+9 {
		t.Fatalf("default node id %q, want %s-<8 hex>", id, host)
	}
	// An empty locality without --zone: @grpc/grpc-js-xds refuses a node
	// without one.
	if loc, ok := at(t, v, "node", "locality").(map[string]any); !ok || len(loc) != 0 {
		t.Fatalf("node %v, want an empty locality without --zone", at(t, v, "node"))
	}
	if at(t, v, "xds_servers", 0, "server_uri") != "127.0.0.1:7400" {
		t.Fatalf("default endpoint: %v", at(t, v, "xds_servers"))
	}

	ca := tlstest.NewCA(t, "ca")
	pair := ca.Client(t, "c")
	dir := filepath.Dir(ca.CertFile)
	t.Chdir(dir)
	v, _ = bootstrapOf(t, "--cacert", filepath.Base(ca.CertFile), "--cert", pair.CertFile, "--key", pair.KeyFile)
	creds := at(t, v, "xds_servers", 0, "channel_creds", 0)
	if at(t, creds, "type") != "tls" || at(t, creds, "config", "ca_certificate_file") != ca.CertFile ||
		at(t, creds, "config", "certificate_file") != pair.CertFile || at(t, creds, "config", "private_key_file") != pair.KeyFile {
		t.Fatalf("channel_creds %v", creds)
	}
}

// The Envoy bootstrap is a valid envoy.config.bootstrap.v3.Bootstrap
// (protojson, strict, then its validation rules): static cluster
// regnode_ads of the endpoints over HTTP/2 (STATIC for IP addresses,
// STRICT_DNS with a host name), ADS over it, CDS over ADS, no LDS; node
// id, cluster and zone; with --cacert an UpstreamTlsContext trusting it.
func TestXDSBootstrapEnvoy(t *testing.T) {
	check := func(t *testing.T, out string) *bootstrapv3.Bootstrap {
		t.Helper()
		var b bootstrapv3.Bootstrap
		if err := protojson.Unmarshal([]byte(out), &b); err != nil {
			t.Fatalf("not an Envoy bootstrap: %v\n%s", err, out)
		}
		if err := b.ValidateAll(); err != nil {
			t.Fatalf("Envoy's validation rules: %v\n%s", err, out)
		}
		ads := b.GetDynamicResources().GetAdsConfig()
		if ads.GetApiType().String() != "GRPC" || ads.GetTransportApiVersion().String() != "V3" ||
			ads.GetGrpcServices()[0].GetEnvoyGrpc().GetClusterName() != "regnode_ads" {
			t.Fatalf("ads_config %v", ads)
		}
		if b.GetDynamicResources().GetCdsConfig().GetAds() == nil || b.GetDynamicResources().GetLdsConfig() != nil {
			t.Fatalf("want cds over ADS and no lds: %v", b.GetDynamicResources())
		}
		cl := b.GetStaticResources().GetClusters()
		if len(cl) != 1 || cl[0].GetName() != "regnode_ads" || cl[0].GetTypedExtensionProtocolOptions()["envoy.extensions.upstreams.http.v3.HttpProtocolOptions"] == nil {
			t.Fatalf("static clusters %v", cl)
		}
		if !strings.Contains(out, `"http2_protocol_options": {}`) {
			t.Fatalf("regnode_ads is not HTTP/2:\n%s", out)
		}
		return &b
	}

	_, out := bootstrapOf(t, "--endpoints", "127.0.0.1:7400,[::1]:7401", "--envoy", "--node-id", "edge-1", "--zone", "eu-1")
	b := check(t, out)
	cl := b.GetStaticResources().GetClusters()[0]
	eps := cl.GetLoadAssignment().GetEndpoints()[0].GetLbEndpoints()
	if cl.GetType().String() != "STATIC" || len(eps) != 2 ||
		eps[0].GetEndpoint().GetAddress().GetSocketAddress().GetAddress() != "127.0.0.1" ||
		eps[1].GetEndpoint().GetAddress().GetSocketAddress().GetAddress() != "::1" ||
		eps[1].GetEndpoint().GetAddress().GetSocketAddress().GetPortValue() != 7401 {
		t.Fatalf("regnode_ads %v", cl)
	}
	if n := b.GetNode(); n.GetId() != "edge-1" || n.GetCluster() == "" || n.GetLocality().GetZone() != "eu-1" {
		t.Fatalf("node %v", n)
	}
	if cl.GetTransportSocket() != nil {
		t.Fatalf("TLS without --cacert: %v", cl.GetTransportSocket())
	}

	ca := tlstest.NewCA(t, "ca")
	_, out = bootstrapOf(t, "--endpoints", "regnode-a:7400,10.0.0.2:7400", "--envoy", "--cacert", ca.CertFile)
	b = check(t, out)
	cl = b.GetStaticResources().GetClusters()[0]
	if cl.GetType().String() != "STRICT_DNS" || cl.GetTransportSocket().GetName() != "envoy.transport_sockets.tls" {
		t.Fatalf("regnode_ads %v", cl)
	}
	if !strings.Contains(out, `"trusted_ca": {`) || !strings.Contains(out, ca.CertFile) || !strings.Contains(out, `"sni": "regnode-a"`) {
		t.Fatalf("no UpstreamTlsContext trusting %s (sni regnode-a):\n%s", ca.CertFile, out)
	}
}

// Bad flags are usage errors (exit 2, nothing printed) and the message
// names the flag; unreadable TLS files fail as in every other command.
func TestXDSBootstrapRefuses(t *testing.T) {
	for _, tc := range []struct {
		args []string
		code int
		want string
	}{
		{[]string{"--zone", strings.Repeat("z", 64)}, 2, "invalid --zone: 64 bytes, at most 63"},
		{[]string{"--zone", "eu|1"}, 2, `invalid --zone "eu|1"`},
		{[]string{"--zone", "eu\t1"}, 2, "invalid --zone"},
		{[]string{"--node-id", " x"}, 2, "invalid --node-id"},
		{[]string{"--node-id", strings.Repeat("n", 129)}, 2, "invalid --node-id: 129 bytes"},
		{[]string{"--node-id", "a\x00b"}, 2, "invalid --node-id"},
		{[]string{"extra"}, 2, "takes no arguments"},
		{[]string{"--bogus"}, 2, "unknown flag: --bogus"},
		{[]string{"--endpoints", "nope"}, 2, "invalid endpoint"},
		{[]string{"--cert", "c.pem"}, 2, "--cert and --key go together"},
		{[]string{"--cacert", filepath.Join(t.TempDir(), "none.pem")}, 1, "none.pem"},
	} {
		code, stdout, stderr := runLocal(append([]string{"xds", "bootstrap"}, tc.args...)...)
		if code != tc.code || stdout != "" || !strings.HasPrefix(stderr, "regctl: ") || !strings.Contains(stderr, tc.want) {
			t.Errorf("regctl xds bootstrap %q: exit %d, stdout %q, stderr %q; want exit %d and %q", tc.args, code, stdout, stderr, tc.code, tc.want)
		}
	}
	// The boundaries are accepted.
	for _, args := range [][]string{{"--zone", strings.Repeat("z", 63)}, {"--node-id", strings.Repeat("n", 128)}, {"--zone", "eu 1"}} {
		if code, _, stderr := runLocal(append([]string{"xds", "bootstrap"}, args...)...); code != 0 {
			t.Errorf("regctl xds bootstrap %q: exit %d, %s", args, code, stderr)
		}
	}
}
