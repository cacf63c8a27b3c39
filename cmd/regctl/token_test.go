package main

import (
	"bytes"
	"context"
	"log/slog"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/regcluster/registry/internal/embedded"
	"github.com/regcluster/registry/internal/etcdtest"
	"github.com/regcluster/registry/internal/node"
	"github.com/regcluster/registry/internal/regnodetest"
	"github.com/regcluster/registry/internal/token"
)

// tokenEnv is the test's environment with REGCTL_TOKEN=tok (none if "").
func tokenEnv(tok string) []string {
	var env []string
	for _, kv := range environ() {
		if !strings.HasPrefix(kv, envToken+"=") {
			env = append(env, kv)
		}
	}
	if tok != "" {
		env = append(env, envToken+"="+tok)
	}
	return env
}

// The scenario with the real binary on a cluster of three
// regnodes (one etcd): register, read, operate and admin tokens do what
// their role says and nothing more; a revoked and an expired token are
// refused by every regnode; every refused call leaves etcd's revision
// where it was.
func TestTokens(t *testing.T) {
	m := etcdtest.Start(t, false)
	var logs [3]*syncBuffer
	var rns [3]*regnodetest.Regnode
	dirs := [3]string{}
	for i := range rns {
		logs[i], dirs[i] = &syncBuffer{}, t.TempDir()
		rns[i] = regnodetest.StartWith(t, node.Config{EtcdEndpoints: []string{m.ClientURL}, Auth: true,
			Embed:  embedded.Config{Dir: dirs[i]},
			Logger: slog.New(slog.NewTextHandler(logs[i], &slog.HandlerOptions{Level: slog.LevelDebug}))}, m.ClientURL)
	}
	// The first regnode wrote the admin token (0600) and logged its path
	// only; the others wrote none and say where it is.
	file := filepath.Join(dirs[0], node.AdminTokenFile)
	st, err := os.Stat(file)
	if err != nil || st.Mode().Perm() != 0o600 {
		t.Fatalf("admin token file: %v, %v", st, err)
	}
	b, _ := os.ReadFile(file)
	admin := strings.TrimSpace(string(b))
	if err := token.Parse(admin); err != nil {
		t.Fatal(err)
	}
	for i := 1; i < 3; i++ {
		if _, err := os.Stat(filepath.Join(dirs[i], node.AdminTokenFile)); !os.IsNotExist(err) {
			t.Fatalf("regnode %d wrote an admin token too: %v", i, err)
		}
	}
	if !strings.Contains(logs[0].String(), file) || !strings.Contains(logs[1].String(), file) {
		t.Fatalf("the regnodes' logs do not say where the admin token is:\n%s\n%s", logs[0], logs[1])
	}
	rn := rns[0]
	ctl := func(tok string, args ...string) result {
		t.Helper()
		return regctl(t, tokenEnv(tok), append([]string{"--endpoints", rn.Addr}, args...)...)
	}
	// refusedCall runs a regctl call that must fail with want, writing nothing.
	refusedCall := func(tok, want string, args ...string) result {
		t.Helper()
		before := headRev(t, rn)
		r := ctl(tok, args...)
		mustFail(t, r, 1, want)
		if after := headRev(t, rn); after != before {
			t.Fatalf("refused regctl %q moved etcd from revision %d to %d", args, before, after)
		}
		return r
	}
	create := func(args ...string) string {
		t.Helper()
		r := ctl(admin, append([]string{"token", "create"}, args...)...)
		if r.code != 0 || !strings.Contains(r.stderr, "shown this once") {
			t.Fatalf("token create: %v", r)
		}
		tok := strings.TrimSpace(r.stdout)
		if err := token.Parse(tok); err != nil {
			t.Fatalf("token create printed no token: %v; %v", err, r)
		}
		return tok
	}

	refusedCall("", "send a token", "list")
	// Bad input: usage errors, exit 2, nothing sent or written.
	before := headRev(t, rn)
	mustFail(t, ctl(admin, "token", "create", "--name", "x", "--role", "boss", "--all"), 2, "--role")
	mustFail(t, ctl(admin, "token", "create", "--name", "x", "--role", "read", "--service", "web", "--all"), 2, "exactly one of --service, --service-prefix and --all")
	mustFail(t, ctl(admin, "token", "create", "--name", "X/1", "--role", "read", "--all"), 2, "--name")
	mustFail(t, ctl(admin, "token", "create", "--name", "x", "--role", "read", "--service", "Web"), 1, "scope.value")
	mustFail(t, ctl(admin+"x", "list"), 2, "$REGCTL_TOKEN: not a registry token")
	if after := headRev(t, rn); after != before {
		t.Fatalf("bad input moved etcd from revision %d to %d", before, after)
	}
	webReg := create("--name", "web-reg", "--role", "register", "--service", "web")
	reader := create("--name", "reader", "--role", "read", "--all")
	oncall := create("--name", "oncall", "--role", "operate", "--all")
	short := create("--name", "short", "--role", "read", "--all", "--ttl", "2s")

	// register on web: registers web (held by a running regctl
	// register), is refused for api and for drain.
	reg := exec.Command(binary(t), "--endpoints", rn.Addr, "register", "--service", "web", "--id", "w-1", "--address", "127.0.0.1:9", "--ttl", "10s")
	reg.Env = tokenEnv(webReg)
	var regErr bytes.Buffer
	reg.Stderr = &regErr
	lines := readLines(t, reg)
	if err := reg.Start(); err != nil {
		t.Fatal(err)
	}
	if l := lines.next(t, 30*time.Second); !strings.Contains(l, "registered web/w-1") {
		t.Fatalf("register web with a register token: %q; stderr %s", l, regErr.String())
	}
	r := refusedCall(webReg, "Register on service api needs role register on service api", "register", "--service", "api", "--id", "a-1", "--address", "127.0.0.1:9")
	if strings.Contains(r.stderr, "--timeout") {
		t.Fatalf("a refusal no retry can change was retried until --timeout: %v", r)
	}
	refusedCall(webReg, "Drain on service web needs role operate", "drain", "web/w-1")

	// read: lists and watches, cannot write.
	if r := mustOK(t, ctl(reader, "list", "web")); !strings.Contains(r.stdout, "w-1") {
		t.Fatalf("list with a read token: %v", r)
	}
	wctx, stopWatch := context.WithCancel(context.Background())
	w := exec.CommandContext(wctx, binary(t), "--endpoints", rns[1].Addr, "-o", "json", "watch", "web")
	w.Env = tokenEnv(reader)
	wl := readLines(t, w)
	if err := w.Start(); err != nil {
		t.Fatal(err)
	}
	if l := wl.next(t, 30*time.Second); !strings.Contains(l, `"type":"snapshot"`) || !strings.Contains(l, "w-1") {
		t.Fatalf("watch with a read token: %q", l)
	}
	stopWatch()
	_ = w.Wait()
	refusedCall(reader, "Drain on service web needs role operate", "drain", "web/w-1")
	refusedCall(reader, "needs role register", "register", "--service", "web", "--id", "w-2", "--address", "127.0.0.1:9")
	refusedCall(reader, "needs role admin", "token", "list")

	// operate drains.
	mustOK(t, ctl(oncall, "drain", "web/w-1", "--reason", "maintenance"))
	if got := stored(t, rn, "web", "w-1"); got.GetLifecycle().String() != "LIFECYCLE_DRAINING" {
		t.Fatalf("after drain with operate: %v", got)
	}
	// The register token's own stop: it drains (its own, by secret) and
	// deregisters.
	if err := reg.Process.Signal(os.Interrupt); err != nil {
		t.Fatal(err)
	}
	if err := reg.Wait(); err != nil {
		t.Fatalf("regctl register with a register token did not stop cleanly: %v; stderr %s", err, regErr.String())
	}
	if strings.Contains(regErr.String(), "failed") || stored(t, rn, "web", "w-1") != nil {
		t.Fatalf("the register token's stop: stderr %s", regErr.String())
	}

	// admin lists (never a secret) and revokes.
	r = mustOK(t, ctl(admin, "token", "list"))
	for _, name := range []string{"admin", "web-reg", "reader", "oncall", "short"} {
		if !strings.Contains(r.stdout, name) {
			t.Fatalf("token list lacks %s: %v", name, r)
		}
	}
	for _, sec := range []string{admin, webReg, reader, oncall, short} {
		if strings.Contains(r.stdout, sec[len(token.Prefix):]) {
			t.Fatalf("token list shows a secret: %v", r)
		}
	}
	mustOK(t, ctl(admin, "token", "revoke", "reader"))
	// Refused by every regnode: waited for, not timed.
	for _, n := range rns {
		waitRefused(t, n.Addr, reader, "unknown or revoked")
		waitRefused(t, n.Addr, short, "expired")
	}
	before = headRev(t, rn)
	for _, n := range rns {
		mustFail(t, regctl(t, tokenEnv(reader), "--endpoints", n.Addr, "drain", "web/w-1"), 1, "unknown or revoked")
		mustFail(t, regctl(t, tokenEnv(short), "--endpoints", n.Addr, "token", "revoke", "oncall"), 1, "expired")
	}
	if after := headRev(t, rn); after != before {
		t.Fatalf("refused calls moved etcd from revision %d to %d", before, after)
	}
	// No log line of any regnode holds a token.
	for i, l := range logs {
		for _, sec := range []string{admin, webReg, reader, oncall, short} {
			if strings.Contains(l.String(), sec[len(token.Prefix):]) {
				t.Fatalf("regnode %d logged a token", i)
			}
		}
		if !strings.Contains(l.String(), "audit") && i == 0 {
			t.Fatalf("no audit line on the regnode that created tokens:\n%s", l)
		}
	}
	if !strings.Contains(logs[0].String(), `method=RevokeToken target=token/reader result=ok`) {
		t.Fatalf("no audit line of the revoke:\n%s", logs[0])
	}
}

// waitRefused waits until regctl list with tok at addr is refused with
// want; a bound only a broken build reaches.
func waitRefused(t *testing.T, addr, tok, want string) {
	t.Helper()
	deadline := time.Now().Add(30 * time.Second)
	for {
		r := regctl(t, tokenEnv(tok), "--endpoints", addr, "list")
		if r.code == 1 && strings.Contains(r.stderr, want) {
			return
		}
		if time.Now().After(deadline) {
			t.Fatalf("regnode %s never refused the token (%s): %v", addr, want, r)
		}
		time.Sleep(20 * time.Millisecond)
	}
}

// headRev is etcd's current revision.
func headRev(t *testing.T, rn *regnodetest.Regnode) int64 {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	resp, err := rn.Etcd.Get(ctx, "\x00")
	if err != nil {
		t.Fatal(err)
	}
	return resp.Header.Revision
}
