package node

import (
	"context"
	"crypto/rand"
	"crypto/tls"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"time"

	"go.etcd.io/etcd/api/v3/v3rpc/rpctypes"
	clientv3 "go.etcd.io/etcd/client/v3"

	"github.com/regcluster/registry/internal/zapslog"
)

// RootPasswordFile is the file in the embedded member's data dir that
// holds the etcd password a regnode generated when it turned etcd's auth
// on (EmbedAuth without a password of its own): user root's when the
// member is alone in its cluster, else its own user's, which holds the
// root role (see embeddedAuth). Mode 0600.
const RootPasswordFile = "etcd-root-password"

// errWrongRoot is an etcd whose auth is on under another root password.
var errWrongRoot = errors.New("etcd auth is on under another password")

// embeddedAuth turns etcd's auth on at the embedded member, with a user
// of the regnode's credential holding etcd's root role, and returns that
// credential: the password given (EtcdUsername and EtcdPassword), else one
// generated on the first start and kept in the data dir (RootPasswordFile).
// It is idempotent: a start after a crash between any two steps finishes
// the job.
//
// A generated password is never shared between members. Alone in its
// cluster the regnode is etcd's user root. In a cluster of several
// members (--initial-cluster) each regnode is a user of its own,
// "regnode-<member name>" (generatedUser), given the root role, and auth
// is turned on by whichever regnode finds every initial member's user
// there with the role: until then the others start with auth still off
// (their client authenticates once it is on). Nobody is locked out by
// another member turning auth on first, and a cluster whose regnodes all
// run with --auth comes up with auth on everywhere. A member that joins
// after auth is on has no user: it needs --etcd-username and
// --etcd-password-file of one.
func (n *Node) embeddedAuth(ctx context.Context, endpoints []string, tlsCfg *tls.Config) (user, password string, err error) {
	user, password = n.cfg.EtcdUsername, n.cfg.EtcdPassword
	file := ""
	var members []string
	if user == "" {
		user, members = generatedUser(n.cfg.Embed.Name, n.cfg.Embed.InitialCluster)
		file = filepath.Join(n.cfg.Embed.Dir, RootPasswordFile)
		if password, err = rootPassword(file); err != nil {
			return "", "", err
		}
	}
	cli, err := clientv3.New(clientv3.Config{Endpoints: endpoints, DialTimeout: 15 * time.Second, TLS: tlsCfg,
		Username: user, Password: password, Logger: zapslog.New(n.log, "error", nil), Context: ctx})
	if err != nil {
		if errors.Is(err, rpctypes.ErrAuthFailed) {
			where := "--etcd-password-file / REGNODE_ETCD_PASSWORD"
			switch {
			case len(members) > 1:
				where = fmt.Sprintf("%s for user %s (this member's: auth was turned on without it, as for a member that joined later; "+
					"give it --etcd-username and --etcd-password-file of a user with etcd's root role)", file, user)
			case file != "":
				where = file + " (another regnode of this cluster turned auth on: give every regnode the same --etcd-username and --etcd-password-file)"
			}
			return "", "", fmt.Errorf("embedded etcd: %w than %s: %v", errWrongRoot, where, err)
		}
		return "", "", fmt.Errorf("embedded etcd: connect to turn auth on: %w", err)
	}
	defer cli.Close()
	st, err := cli.AuthStatus(ctx)
	if err != nil {
		return "", "", fmt.Errorf("embedded etcd: auth status: %w", err)
	}
	if st.Enabled {
		return user, password, nil // and our credential was accepted above
	}
	if _, err := cli.UserAdd(ctx, user, password); errors.Is(err, rpctypes.ErrUserAlreadyExist) {
		_, err = cli.UserChangePassword(ctx, user, password)
		if err != nil {
			return "", "", fmt.Errorf("embedded etcd: set the password of user %s: %w", user, err)
		}
	} else if err != nil {
		return "", "", fmt.Errorf("embedded etcd: add user %s: %w", user, err)
	}
	if user != "root" {
		// etcd turns auth on only with a root user; its password is one
		// nobody knows, the regnode's user holds the root role.
		if _, err := cli.UserAdd(ctx, "root", rand.Text()); err != nil && !errors.Is(err, rpctypes.ErrUserAlreadyExist) {
			return "", "", fmt.Errorf("embedded etcd: add user root: %w", err)
		}
		if _, err := cli.UserGrantRole(ctx, "root", "root"); err != nil && !alreadyGranted(err) {
			return "", "", fmt.Errorf("embedded etcd: grant root to root: %w", err)
		}
	}
	if _, err := cli.UserGrantRole(ctx, user, "root"); err != nil && !alreadyGranted(err) {
		return "", "", fmt.Errorf("embedded etcd: grant root to %s: %w", user, err)
	}
	if missing, err := usersMissing(ctx, cli, members); err != nil {
		return "", "", err
	} else if len(missing) > 0 {
		n.log.Info("etcd auth turns on once every member's regnode has started with --auth (or --etcd-server-auth)",
			"user", user, "password_file", file, "waiting_for", strings.Join(missing, ","))
		return user, password, nil
	}
	if _, err := cli.AuthEnable(ctx); err != nil {
		return "", "", fmt.Errorf("embedded etcd: turn auth on: %w", err)
	}
	n.log.Info("etcd auth turned on at the embedded member", "user", user, "password_file", file)
	return user, password, nil
}

// generatedUser is the etcd user of a generated password: root when the
// member is alone in its initial cluster, else "regnode-<name>", with the
// users of every member of the initial cluster (sorted; nil when alone).
func generatedUser(name, initialCluster string) (string, []string) {
	seen := map[string]bool{}
	var users []string
	for _, m := range strings.Split(initialCluster, ",") {
		mn, _, ok := strings.Cut(strings.TrimSpace(m), "=")
		if ok && mn != "" && !seen[mn] {
			seen[mn] = true
			users = append(users, memberUserPrefix+mn)
		}
	}
	if len(users) < 2 {
		return "root", nil
	}
	slices.Sort(users)
	return memberUserPrefix + name, users
}

// memberUserPrefix names the etcd user of each member's regnode in a
// cluster of several embedded members.
const memberUserPrefix = "regnode-"

// usersMissing is those of users that etcd does not have yet with the
// root role.
func usersMissing(ctx context.Context, cli *clientv3.Client, users []string) ([]string, error) {
	var missing []string
	for _, u := range users {
		r, err := cli.UserGet(ctx, u)
		if errors.Is(err, rpctypes.ErrUserNotFound) {
			missing = append(missing, u)
			continue
		}
		if err != nil {
			return nil, fmt.Errorf("embedded etcd: read user %s: %w", u, err)
		}
		if !slices.Contains(r.Roles, "root") {
			missing = append(missing, u)
		}
	}
	return missing, nil
}

func alreadyGranted(err error) bool {
	return err != nil && strings.Contains(err.Error(), "already")
}

// rootPassword reads the generated root password from file, or generates
// it there (mode 0600) if there is none. A file others may read is
// refused: it is the key to the whole registry.
func rootPassword(file string) (string, error) {
	if fi, err := os.Stat(file); err == nil {
		if fi.Mode().Perm()&0o077 != 0 {
			return "", fmt.Errorf("%s is mode %o: others may read the etcd root password (chmod 600 it)", file, fi.Mode().Perm())
		}
		b, err := os.ReadFile(file)
		if err != nil {
			return "", fmt.Errorf("read the etcd root password: %w", err)
		}
		pw := strings.TrimRight(string(b), "\r\n")
		if pw == "" {
			return "", fmt.Errorf("%s is empty", file)
		}
		return pw, nil
	} else if !errors.Is(err, os.ErrNotExist) {
		return "", fmt.Errorf("read the etcd root password: %w", err)
	}
	pw := rand.Text() // 130 random bits
	tmp := file + ".tmp"
	f, err := os.OpenFile(tmp, os.O_WRONLY|os.O_CREATE|os.O_TRUNC, 0o600)
	if err != nil {
		return "", fmt.Errorf("write the etcd root password: %w", err)
	}
	_, err = f.WriteString(pw + "\n")
	if err == nil {
		err = f.Sync()
	}
	if cerr := f.Close(); err == nil {
		err = cerr
	}
	if err == nil {
		err = os.Rename(tmp, file) // whole or not at all
	}
	if err != nil {
		os.Remove(tmp)
		return "", fmt.Errorf("write the etcd root password to %s: %w", file, err)
	}
	return pw, nil
}
