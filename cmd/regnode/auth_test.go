package main_test

import (
	"context"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	clientv3 "go.etcd.io/etcd/client/v3"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/metadata"
	"google.golang.org/grpc/status"

	"github.com/regcluster/registry/internal/etcdtest"
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

// --auth alone turns the embedded etcd's own auth on: an anonymous etcd
// client's Get and Put are refused and nothing is written (as root, with
// the generated password kept 0600 in the data dir, the key is absent).
// --etcd-server-auth=false leaves the client port open, and says so.
func TestAuthTurnsEtcdAuthOn(t *testing.T) {
	dir := t.TempDir()
	env := embeddedEnv(t, dir)
	env["REGNODE_AUTH"] = "true"
	p := start(t, env)
	waitServing(t, dial(t, env["REGNODE_LISTEN"]), p)
	p.waitStderr(t, "etcd auth turned on at the embedded member")
	url := env["REGNODE_LISTEN_CLIENT_URLS"]
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	etcd := func(user, password string) (*clientv3.Client, error) {
		return clientv3.New(clientv3.Config{Endpoints: []string{url}, DialTimeout: 15 * time.Second,
			Username: user, Password: password, Logger: etcdtest.QuietLogger()})
	}
	anon, err := etcd("", "")
	if err != nil {
		t.Fatal(err)
	}
	defer anon.Close()
	if _, err := anon.Get(ctx, "/registry/", clientv3.WithPrefix()); err == nil || !strings.Contains(err.Error(), "user name is empty") {
		t.Fatalf("anonymous Get: err = %v, want refused", err)
	}
	if _, err := anon.Put(ctx, "/registry/v1/instances/web/evil", "x"); err == nil || !strings.Contains(err.Error(), "user name is empty") {
		t.Fatalf("anonymous Put: err = %v, want refused", err)
	}
	file := filepath.Join(dir, "etcd-root-password")
	if st, err := os.Stat(file); err != nil || st.Mode().Perm() != 0o600 {
		t.Fatalf("generated password file: %v, %v; want mode 600", st, err)
	}
	pw, err := os.ReadFile(file)
	if err != nil {
		t.Fatal(err)
	}
	root, err := etcd("root", strings.TrimSpace(string(pw)))
	if err != nil {
		t.Fatal(err)
	}
	defer root.Close()
	if r, err := root.Get(ctx, "/registry/v1/instances/web/evil"); err != nil || len(r.Kvs) != 0 {
		t.Fatalf("as root: %v, %v; want no key written", r, err)
	}
	if err := p.cmd.Process.Signal(os.Interrupt); err != nil {
		t.Fatal(err)
	}
	if code := p.wait(t, 60*time.Second); code != 0 {
		t.Fatalf("exit %d; stderr:\n%s", code, p.stderr)
	}

	open := embeddedEnv(t, t.TempDir())
	open["REGNODE_AUTH"] = "true"
	p = start(t, open, "--etcd-server-auth=false")
	waitServing(t, dial(t, open["REGNODE_LISTEN"]), p)
	p.waitStderr(t, "--etcd-server-auth=false: the embedded etcd's client port is open to anyone")
	if !strings.Contains(p.stderr.String(), "level=WARN") {
		t.Errorf("the open client port is not a warning:\n%s", p.stderr)
	}
	url = open["REGNODE_LISTEN_CLIENT_URLS"]
	anon2, err := etcd("", "")
	if err != nil {
		t.Fatal(err)
	}
	defer anon2.Close()
	if _, err := anon2.Put(ctx, "/elsewhere", "x"); err != nil {
		t.Fatalf("anonymous Put with --etcd-server-auth=false: %v", err)
	}
	if r, err := anon2.Get(ctx, "/elsewhere"); err != nil || len(r.Kvs) != 1 {
		t.Fatalf("anonymous Get with --etcd-server-auth=false: %v, %v", r, err)
	}
}
