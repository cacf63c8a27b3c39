package token_test

import (
	"context"
	"errors"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"

	clientv3 "go.etcd.io/etcd/client/v3"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	"github.com/regcluster/registry/internal/etcdtest"
	"github.com/regcluster/registry/internal/token"
)

const prefix = "/registry/v1/"

// runCache runs a cache of cli until the test ends, and waits for its
// first list.
func runCache(t *testing.T, cli *clientv3.Client, now func() time.Time) *token.Cache {
	t.Helper()
	c, err := token.NewCache(token.Config{Client: cli, Prefix: prefix, Now: now})
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan struct{})
	go func() { defer close(done); _ = c.Run(ctx) }()
	t.Cleanup(func() { cancel(); <-done })
	select {
	case <-c.Ready():
	case <-time.After(30 * time.Second):
		t.Fatal("the cache never loaded")
	}
	return c
}

// eventually waits for cond, failing after a bound only a broken build
// reaches.
func eventually(t *testing.T, what string, cond func() bool) {
	t.Helper()
	deadline := time.Now().Add(30 * time.Second)
	for !cond() {
		if time.Now().After(deadline) {
			t.Fatalf("never: %s", what)
		}
		time.Sleep(5 * time.Millisecond)
	}
}

func code(err error) codes.Code { return status.Code(err) }

func TestCacheCreateCheckRevoke(t *testing.T) {
	cli := etcdtest.Start(t, false).Client(t)
	ctx := context.Background()
	c := runCache(t, cli, nil)

	if _, err := c.Check("", token.Get, "web"); code(err) != codes.Unauthenticated {
		t.Fatalf("no token: %v", err)
	}
	if _, err := c.Check(token.New(), token.Get, "web"); code(err) != codes.Unauthenticated {
		t.Fatalf("unknown token: %v", err)
	}
	_, tok, _, err := token.Create(ctx, cli, prefix, "web-reg", token.Register, token.Scope{Kind: token.ScopeService, Value: "web"}, 0, "test")
	if err != nil {
		t.Fatal(err)
	}
	if _, _, _, err := token.Create(ctx, cli, prefix, "web-reg", token.Read, token.Scope{Kind: token.ScopeAll}, 0, "test"); !errors.Is(err, token.ErrExists) {
		t.Fatalf("second create of one name: %v", err)
	}
	eventually(t, "the created token is allowed", func() bool {
		_, err := c.Check(tok, token.RegisterCall, "web")
		return err == nil
	})
	// Refused for another service, naming it and the role needed; a
	// refused call is no use.
	before := lastUsed(c, "web-reg")
	_, err = c.Check(tok, token.RegisterCall, "api")
	if code(err) != codes.PermissionDenied || !strings.Contains(err.Error(), "service api") || !strings.Contains(err.Error(), "role register") {
		t.Fatalf("register on api: %v", err)
	}
	_, err = c.Check(tok, token.Drain, "web")
	if code(err) != codes.PermissionDenied || !strings.Contains(err.Error(), "role operate") {
		t.Fatalf("drain: %v", err)
	}
	if lastUsed(c, "web-reg") != before {
		t.Fatal("a refused call moved the token's last use")
	}
	if strings.Contains(err.Error(), tok[len(token.Prefix):]) {
		t.Fatalf("the error quotes the token: %v", err)
	}
	if _, err := token.Revoke(ctx, cli, prefix, "web-reg"); err != nil {
		t.Fatal(err)
	}
	eventually(t, "the revoked token is refused", func() bool {
		_, err := c.Check(tok, token.Get, "web")
		return code(err) == codes.Unauthenticated
	})
	if _, err := token.Revoke(ctx, cli, prefix, "web-reg"); !errors.Is(err, token.ErrNotFound) {
		t.Fatalf("second revoke: %v", err)
	}
}

func lastUsed(c *token.Cache, name string) time.Time {
	for _, e := range c.List() {
		if e.Name == name {
			return e.LastUsed
		}
	}
	return time.Time{}
}

// Expiry needs no event: the check judges it by the clock.
func TestCacheExpiry(t *testing.T) {
	cli := etcdtest.Start(t, false).Client(t)
	var mu sync.Mutex
	now := time.Now()
	clock := func() time.Time { mu.Lock(); defer mu.Unlock(); return now }
	c := runCache(t, cli, clock)
	_, tok, _, err := token.Create(context.Background(), cli, prefix, "short", token.Read, token.Scope{Kind: token.ScopeAll}, time.Hour, "test")
	if err != nil {
		t.Fatal(err)
	}
	eventually(t, "the token is allowed", func() bool { _, err := c.Check(tok, token.List, ""); return err == nil })
	mu.Lock()
	now = now.Add(2 * time.Hour)
	mu.Unlock()
	if _, err := c.Check(tok, token.List, ""); code(err) != codes.Unauthenticated || !strings.Contains(err.Error(), "expired") {
		t.Fatalf("expired token: %v", err)
	}
}

// A value under the tokens prefix that is not a record, or a record
// stored under another name, grants nothing; the cache goes on.
func TestCacheSkipsJunk(t *testing.T) {
	cli := etcdtest.Start(t, false).Client(t)
	ctx := context.Background()
	_, tok, _, err := token.Create(ctx, cli, prefix, "real", token.Admin, token.Scope{Kind: token.ScopeAll}, 0, "test")
	if err != nil {
		t.Fatal(err)
	}
	// A copy of the real record under another name must not work twice.
	resp, err := cli.Get(ctx, token.Key(prefix, "real"))
	if err != nil {
		t.Fatal(err)
	}
	if _, err := cli.Put(ctx, token.Key(prefix, "copy"), string(resp.Kvs[0].Value)); err != nil {
		t.Fatal(err)
	}
	if _, err := cli.Put(ctx, token.Key(prefix, "junk"), "{not json"); err != nil {
		t.Fatal(err)
	}
	c := runCache(t, cli, nil)
	if _, err := c.Check(tok, token.ListTokens, ""); err != nil {
		t.Fatalf("the real token: %v", err)
	}
	if got := len(c.List()); got != 1 {
		t.Fatalf("%d records listed, want 1 (the junk and the copy skipped)", got)
	}
	// The copy arriving by the watch is skipped too, and its delete
	// leaves the real token alone.
	if _, err := cli.Put(ctx, token.Key(prefix, "copy2"), string(resp.Kvs[0].Value)); err != nil {
		t.Fatal(err)
	}
	if _, err := cli.Delete(ctx, token.Key(prefix, "copy2")); err != nil {
		t.Fatal(err)
	}
	rev, _ := cli.Get(ctx, "x")
	eventually(t, "the cache saw the copy come and go", func() bool { return c.Revision() >= rev.Header.Revision-1 })
	if _, err := c.Check(tok, token.ListTokens, ""); err != nil {
		t.Fatalf("the real token after a copy's delete: %v", err)
	}
}

// Regnodes starting together make one first admin token; its file is
// mode 0600 and holds the token; later starts make none and say where it
// is; the loser's file is gone.
func TestBootstrapOnce(t *testing.T) {
	cli := etcdtest.Start(t, false).Client(t)
	ctx := context.Background()
	dir := t.TempDir()
	const n = 4
	type result struct {
		file, by string
		created  bool
		err      error
	}
	res := make([]result, n)
	var wg sync.WaitGroup
	for i := range n {
		wg.Add(1)
		go func() {
			defer wg.Done()
			f := filepath.Join(dir, string(rune('a'+i)), "admin-token")
			file, by, created, err := token.Bootstrap(ctx, cli, prefix, f, "node-"+string(rune('a'+i)))
			res[i] = result{file, by, created, err}
		}()
	}
	wg.Wait()
	var winner result
	made := 0
	for _, r := range res {
		if r.err != nil {
			t.Fatal(r.err)
		}
		if r.created {
			made++
			winner = r
		}
	}
	if made != 1 {
		t.Fatalf("%d regnodes made the first token, want 1", made)
	}
	for i, r := range res {
		if r.file != winner.file || r.by != winner.by {
			t.Fatalf("regnode %d says the token is at %s by %s, not %s by %s", i, r.file, r.by, winner.file, winner.by)
		}
		own := filepath.Join(dir, string(rune('a'+i)), "admin-token")
		if own != winner.file {
			if _, err := os.Stat(own); !os.IsNotExist(err) {
				t.Fatalf("a losing regnode's file is left: %v", err)
			}
		}
	}
	st, err := os.Stat(winner.file)
	if err != nil {
		t.Fatal(err)
	}
	if st.Mode().Perm() != 0o600 {
		t.Fatalf("token file mode %v, want 0600", st.Mode().Perm())
	}
	b, err := os.ReadFile(winner.file)
	if err != nil {
		t.Fatal(err)
	}
	tok := strings.TrimSpace(string(b))
	c := runCache(t, cli, nil)
	if r, err := c.Check(tok, token.CreateToken, ""); err != nil || r.Name != token.BootstrapName {
		t.Fatalf("the first admin token: %v, %v", r, err)
	}
	if _, _, created, err := token.Bootstrap(ctx, cli, prefix, filepath.Join(dir, "later"), "later"); err != nil || created {
		t.Fatalf("a later start: created %v, %v", created, err)
	}
}
