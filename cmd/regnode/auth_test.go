package main_test

import (
	"context"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/metadata"
	"google.golang.org/grpc/status"

	"github.com/regcluster/registry/internal/token"
	registryv1 "github.com/regcluster/registry/proto/registry/v1"
)

// REGNODE_AUTH turns tokens on: the first start writes the admin token
// (0600) into the data dir and logs its path, never the token; calls
// without it are Unauthenticated, with it served; a restart makes no
// other and the token still works.
func TestAuthFromEnv(t *testing.T) {
	dir := t.TempDir()
	env := embeddedEnv(t, dir)
	env["REGNODE_AUTH"] = "true"
	p := start(t, env)
	cc := dial(t, env["REGNODE_LISTEN"])
	waitServing(t, cc, p)
	file := filepath.Join(dir, "admin-token")
	p.waitStderr(t, "file="+file)
	st, err := os.Stat(file)
	if err != nil || st.Mode().Perm() != 0o600 {
		t.Fatalf("admin token file: %v, %v", st, err)
	}
	b, _ := os.ReadFile(file)
	tok := strings.TrimSpace(string(b))
	if err := token.Parse(tok); err != nil {
		t.Fatal(err)
	}
	reg := registryv1.NewRegistryClient(cc)
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	if _, err := reg.List(ctx, &registryv1.ListRequest{}); status.Code(err) != codes.Unauthenticated {
		t.Fatalf("List without a token: %v", err)
	}
	actx := metadata.AppendToOutgoingContext(ctx, "authorization", "Bearer "+tok)
	if _, err := reg.List(actx, &registryv1.ListRequest{}); err != nil {
		t.Fatalf("List with the admin token: %v", err)
	}
	if strings.Contains(p.stderr.String(), tok[len(token.Prefix):]) {
		t.Fatal("regnode logged the token")
	}
	if err := p.cmd.Process.Signal(os.Interrupt); err != nil {
		t.Fatal(err)
	}
	if code := p.wait(t, 60*time.Second); code != 0 {
		t.Fatalf("exit %d; stderr:\n%s", code, p.stderr)
	}

	p = start(t, env)
	cc = dial(t, env["REGNODE_LISTEN"])
	waitServing(t, cc, p)
	p.waitStderr(t, "the first admin token was made earlier")
	b2, _ := os.ReadFile(file)
	if string(b2) != string(b) {
		t.Fatal("a restart rewrote the admin token")
	}
	if _, err := registryv1.NewRegistryClient(cc).List(actx, &registryv1.ListRequest{}); err != nil {
		t.Fatalf("List with the admin token after a restart: %v", err)
	}
}
