package node_test

import (
	"bytes"
	"context"
	"io"
	"log/slog"
	"net/http"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials/insecure"
	healthpb "google.golang.org/grpc/health/grpc_health_v1"
	"google.golang.org/protobuf/types/known/durationpb"

	"github.com/regcluster/registry/client"
	"github.com/regcluster/registry/internal/embedded"
	"github.com/regcluster/registry/internal/etcdtest"
	"github.com/regcluster/registry/internal/node"
	"github.com/regcluster/registry/internal/regnodetest"
	registryv1 "github.com/regcluster/registry/proto/registry/v1"
)

// With --auth the HTTP API judges its caller by the Authorization header
// it forwards: nothing without a token, reads with read, drain with
// operate only. The gRPC health service answers without a token and says
// only SERVING; /metrics holds no token.
func TestAuthHTTPAndHealth(t *testing.T) {
	m := etcdtest.Start(t, false)
	dir := t.TempDir()
	rn := regnodetest.StartWith(t, node.Config{EtcdEndpoints: []string{m.ClientURL}, Auth: true,
		Embed: embedded.Config{Dir: dir}}, m.ClientURL)
	b, err := os.ReadFile(filepath.Join(dir, node.AdminTokenFile))
	if err != nil {
		t.Fatal(err)
	}
	adminTok := strings.TrimSpace(string(b))
	admin, err := client.New(client.Config{Endpoints: []string{rn.Addr}, Token: adminTok})
	if err != nil {
		t.Fatal(err)
	}
	defer admin.Close()
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	mk := func(name string, role registryv1.TokenRole) string {
		resp, err := admin.Tokens().CreateToken(ctx, &registryv1.CreateTokenRequest{Name: name, Role: role,
			Scope: &registryv1.TokenScope{Kind: registryv1.TokenScope_KIND_ALL}})
		if err != nil {
			t.Fatal(err)
		}
		return resp.Secret
	}
	readTok, operTok := mk("reader", registryv1.TokenRole_TOKEN_ROLE_READ), mk("oncall", registryv1.TokenRole_TOKEN_ROLE_OPERATE)
	if _, err := admin.API().Register(ctx, &registryv1.RegisterRequest{Ttl: durationpb.New(time.Minute),
		Instance: &registryv1.Instance{Service: "web", Id: "w-1", Address: "10.0.0.1:80"}}); err != nil {
		t.Fatal(err)
	}

	base := "http://" + rn.Node.MetricsAddr()
	do := func(method, path, tok string) (int, string) {
		t.Helper()
		req, err := http.NewRequestWithContext(ctx, method, base+path, nil)
		if err != nil {
			t.Fatal(err)
		}
		if tok != "" {
			req.Header.Set("Authorization", "Bearer "+tok)
		}
		resp, err := http.DefaultClient.Do(req)
		if err != nil {
			t.Fatal(err)
		}
		defer resp.Body.Close()
		body, _ := io.ReadAll(resp.Body)
		return resp.StatusCode, string(body)
	}
	for _, tc := range []struct {
		method, path, tok string
		want              int
		says              string
	}{
		{"GET", "/api/v1/instances", "", http.StatusUnauthorized, "send a token"},
		{"GET", "/api/v1/instances", readTok, http.StatusOK, "w-1"},
		{"GET", "/api/v1/prometheus/targets", "", http.StatusUnauthorized, "send a token"},
		{"GET", "/api/v1/prometheus/targets", readTok, http.StatusOK, `"__meta_registry_id":"w-1"`},
		{"POST", "/api/v1/services/web/instances/w-1/drain", "", http.StatusUnauthorized, "send a token"},
		{"POST", "/api/v1/services/web/instances/w-1/drain", readTok, http.StatusForbidden, "needs role operate"},
		{"POST", "/api/v1/services/web/instances/w-1/drain", operTok, http.StatusOK, "DRAINING"},
	} {
		code, body := do(tc.method, tc.path, tc.tok)
		if code != tc.want || !strings.Contains(body, tc.says) {
			t.Errorf("%s %s (token %v): %d %s, want %d saying %q", tc.method, tc.path, tc.tok != "", code, body, tc.want, tc.says)
		}
	}
	// Registration over HTTP with auth: a register token registers; an
	// operator's DELETE (no secret) needs operate, whoever calls.
	regTok := mk("deployer", registryv1.TokenRole_TOKEN_ROLE_REGISTER)
	post := func(path, tok, body string) (int, string) {
		t.Helper()
		req, err := http.NewRequestWithContext(ctx, "POST", base+path, strings.NewReader(body))
		if err != nil {
			t.Fatal(err)
		}
		req.Header.Set("Authorization", "Bearer "+tok)
		resp, err := http.DefaultClient.Do(req)
		if err != nil {
			t.Fatal(err)
		}
		defer resp.Body.Close()
		b, _ := io.ReadAll(resp.Body)
		return resp.StatusCode, string(b)
	}
	w2 := `{"id":"w-2","address":"10.0.0.2:80"}`
	if code, body := post("/api/v1/services/web/instances", readTok, w2); code != http.StatusForbidden {
		t.Errorf("register over HTTP with a read token: %d %s, want 403", code, body)
	}
	if code, body := post("/api/v1/services/web/instances", regTok, w2); code != http.StatusCreated || !strings.Contains(body, `"secret"`) {
		t.Errorf("register over HTTP with a register token: %d %s, want 201", code, body)
	}
	for _, tc := range []struct {
		tok  string
		want int
	}{{"", http.StatusUnauthorized}, {regTok, http.StatusForbidden}, {readTok, http.StatusForbidden}, {operTok, http.StatusOK}} {
		if code, body := do("DELETE", "/api/v1/services/web/instances/w-2", tc.tok); code != tc.want {
			t.Errorf("operator's DELETE over HTTP (token %v): %d %s, want %d", tc.tok != "", code, body, tc.want)
		}
	}

	_, metrics := do("GET", "/metrics", "")
	for _, tok := range []string{adminTok, readTok, operTok, regTok} {
		if strings.Contains(metrics, tok[8:]) {
			t.Fatal("/metrics holds a token")
		}
	}
	if !strings.Contains(metrics, `registry_auth_refused_total{code="PermissionDenied",method="Drain"} 1`) {
		t.Errorf("the refused drain is not counted:\n%s", metrics)
	}

	// A regnode of the same registry started without --auth says loudly
	// that it bypasses the tokens.
	var logs syncBuf
	regnodetest.StartWith(t, node.Config{EtcdEndpoints: []string{m.ClientURL}, Embed: embedded.Config{Dir: t.TempDir()},
		Logger: slog.New(slog.NewTextHandler(&logs, nil))}, m.ClientURL)
	if !strings.Contains(logs.String(), "level=WARN") || !strings.Contains(logs.String(), "runs without --auth") {
		t.Errorf("a regnode without --auth on a registry with tokens did not warn:\n%s", logs.String())
	}

	cc, err := grpc.NewClient(rn.Addr, grpc.WithTransportCredentials(insecure.NewCredentials()))
	if err != nil {
		t.Fatal(err)
	}
	defer cc.Close()
	h, err := healthpb.NewHealthClient(cc).Check(ctx, &healthpb.HealthCheckRequest{Service: registryv1.Registry_ServiceDesc.ServiceName})
	if err != nil || h.Status != healthpb.HealthCheckResponse_SERVING {
		t.Fatalf("health without a token: %v, %v", h, err)
	}
}

// syncBuf is a log sink written by a regnode while the test reads it.
type syncBuf struct {
	mu sync.Mutex
	b  bytes.Buffer
}

func (s *syncBuf) Write(p []byte) (int, error) { s.mu.Lock(); defer s.mu.Unlock(); return s.b.Write(p) }
func (s *syncBuf) String() string              { s.mu.Lock(); defer s.mu.Unlock(); return s.b.String() }
