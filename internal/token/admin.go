package token

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"time"

	clientv3 "go.etcd.io/etcd/client/v3"
)

// Create stores a new token of role on scope named name (expiring after
// ttl; 0: never) and returns its record and secret, the only time the
// secret exists outside the caller. It writes only if no token has the
// name (ErrExists otherwise, nothing written).
func Create(ctx context.Context, cli *clientv3.Client, prefix, name string, role Role, scope Scope, ttl time.Duration, by string) (*Record, string, int64, error) {
	if ttl < 0 {
		return nil, "", 0, fmt.Errorf("ttl %s is negative", ttl)
	}
	tok := New()
	now := time.Now().UTC().Truncate(time.Second)
	r := &Record{Name: name, Role: role, Scope: scope, Created: now, Hash: Hash(tok), CreatedBy: by}
	if ttl > 0 {
		r.Expires = now.Add(ttl)
	}
	b, err := Encode(r)
	if err != nil {
		return nil, "", 0, err
	}
	key := Key(prefix, name)
	resp, err := cli.Txn(ctx).If(clientv3.Compare(clientv3.CreateRevision(key), "=", 0)).
		Then(clientv3.OpPut(key, string(b))).Commit()
	if err != nil {
		return nil, "", 0, fmt.Errorf("store token %s: %w", name, err)
	}
	if !resp.Succeeded {
		return nil, "", 0, fmt.Errorf("token %s: %w (revoke it first)", name, ErrExists)
	}
	return r, tok, resp.Header.Revision, nil
}

// Revoke deletes the token named name (ErrNotFound if there is none) and
// returns the revision of the delete. Every regnode's Cache drops it when
// the delete reaches its watch.
func Revoke(ctx context.Context, cli *clientv3.Client, prefix, name string) (int64, error) {
	resp, err := cli.Delete(ctx, Key(prefix, name))
	if err != nil {
		return 0, fmt.Errorf("revoke token %s: %w", name, err)
	}
	if resp.Deleted == 0 {
		return 0, fmt.Errorf("token %s: %w", name, ErrNotFound)
	}
	return resp.Header.Revision, nil
}

// BootstrapName is the name of the first admin token.
const BootstrapName = "admin"

// bootstrap is the value of BootstrapKey: who made the first token, and
// where it put it.
type bootstrap struct {
	Node string    `json:"node"`
	File string    `json:"file"`
	At   time.Time `json:"at"`
}

// Bootstrap makes sure the registry has had a first admin token: if no
// regnode ever made one (no BootstrapKey), it makes token "admin" (role
// admin, scope all, no expiry) and writes it to file (mode 0600, its
// directory made 0700 if absent); otherwise it writes nothing. It returns
// the file holding the token and the regnode that wrote it, whether that
// was this call or an earlier one (maybe on another host). It is safe
// against a crash at any point and against regnodes starting together:
// one transaction makes the marker and the token, and the file is written
// before it, so a token in etcd always has its file; a file left by a
// start that lost the race, or crashed before its transaction, is reused
// or removed. The token itself is never logged or returned.
func Bootstrap(ctx context.Context, cli *clientv3.Client, prefix, file, node string) (writtenTo, by string, created bool, err error) {
	key := BootstrapKey(prefix)
	get := func() (*bootstrap, error) {
		resp, err := cli.Get(ctx, key)
		if err != nil {
			return nil, fmt.Errorf("read %s: %w", key, err)
		}
		if len(resp.Kvs) == 0 {
			return nil, nil
		}
		var b bootstrap
		if err := json.Unmarshal(resp.Kvs[0].Value, &b); err != nil {
			return nil, fmt.Errorf("%s holds no bootstrap record: %w", key, err)
		}
		return &b, nil
	}
	if b, err := get(); err != nil || b != nil {
		if b == nil {
			return "", "", false, err
		}
		return b.File, b.Node, false, nil
	}
	abs, err := filepath.Abs(file)
	if err != nil {
		return "", "", false, fmt.Errorf("admin token file %s: %w", file, err)
	}
	tok, err := readTokenFile(abs)
	if err != nil {
		return "", "", false, err
	}
	if tok == "" {
		tok = New()
		if err := writeTokenFile(abs, tok); err != nil {
			return "", "", false, err
		}
	}
	now := time.Now().UTC().Truncate(time.Second)
	rec, err := Encode(&Record{Name: BootstrapName, Role: Admin, Scope: Scope{Kind: ScopeAll},
		Created: now, Hash: Hash(tok), CreatedBy: "regnode " + node})
	if err != nil {
		return "", "", false, err
	}
	mark, err := json.Marshal(bootstrap{Node: node, File: abs, At: now})
	if err != nil {
		return "", "", false, err
	}
	tkey := Key(prefix, BootstrapName)
	resp, err := cli.Txn(ctx).If(clientv3.Compare(clientv3.CreateRevision(key), "=", 0),
		clientv3.Compare(clientv3.CreateRevision(tkey), "=", 0)).
		Then(clientv3.OpPut(key, string(mark)), clientv3.OpPut(tkey, string(rec))).Commit()
	if err != nil {
		return "", "", false, fmt.Errorf("store the first admin token: %w", err)
	}
	if resp.Succeeded {
		return abs, node, true, nil
	}
	// Another regnode made it first: our file grants nothing.
	_ = os.Remove(abs)
	b, err := get()
	if err != nil || b == nil {
		return "", "", false, fmt.Errorf("first admin token: the transaction lost, but no bootstrap record is there (%v); is a token named %s already stored?", err, BootstrapName)
	}
	return b.File, b.Node, false, nil
}

// readTokenFile is the token in file, "" if there is no file.
func readTokenFile(file string) (string, error) {
	b, err := os.ReadFile(file)
	if errors.Is(err, os.ErrNotExist) {
		return "", nil
	}
	if err != nil {
		return "", fmt.Errorf("read admin token file %s: %w", file, err)
	}
	tok := strings.TrimSpace(string(b))
	if err := Parse(tok); err != nil {
		return "", fmt.Errorf("admin token file %s: %w (remove it to make another)", file, err)
	}
	return tok, nil
}

// writeTokenFile writes tok to file atomically, mode 0600.
func writeTokenFile(file, tok string) error {
	dir := filepath.Dir(file)
	if err := os.MkdirAll(dir, 0o700); err != nil {
		return fmt.Errorf("admin token directory %s: %w", dir, err)
	}
	f, err := os.CreateTemp(dir, ".admin-token-*")
	if err != nil {
		return fmt.Errorf("admin token file in %s: %w", dir, err)
	}
	defer os.Remove(f.Name()) // after the rename: nothing
	if err := f.Chmod(0o600); err != nil {
		f.Close()
		return fmt.Errorf("admin token file %s: %w", f.Name(), err)
	}
	if _, err := f.WriteString(tok + "\n"); err != nil {
		f.Close()
		return fmt.Errorf("write admin token file %s: %w", f.Name(), err)
	}
	if err := f.Sync(); err != nil {
		f.Close()
		return fmt.Errorf("sync admin token file %s: %w", f.Name(), err)
	}
	if err := f.Close(); err != nil {
		return fmt.Errorf("close admin token file %s: %w", f.Name(), err)
	}
	if err := os.Rename(f.Name(), file); err != nil {
		return fmt.Errorf("admin token file %s: %w", file, err)
	}
	return nil
}
