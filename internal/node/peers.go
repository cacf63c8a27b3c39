package node

import (
	"context"
	"fmt"
	"strings"
	"time"

	clientv3 "go.etcd.io/etcd/client/v3"
	"go.etcd.io/etcd/client/v3/concurrency"
	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials"
	"google.golang.org/grpc/credentials/insecure"

	"github.com/regcluster/registry/internal/server"
	"github.com/regcluster/registry/internal/shard"
	"github.com/regcluster/registry/internal/tlsfiles"
	registryv1 "github.com/regcluster/registry/proto/registry/v1"
)

// Regnodes announce themselves: <prefix>nodes/<advertised API address>
// holds the regnode's name under a session lease (keyed by address, not
// name: the address is what a peer dials, and it is unique where names
// need not be, e.g. several regnodes of a host with the default name on
// port 0), so that the key lives exactly as long as the regnode does (a
// killed one's key goes when its lease expires). A regnode answering
// WaitApplied reads the announcements and asks every other regnode for
// its subscribers. etcd is the one place every regnode, and every caller
// through any regnode, agrees on who is there; a list given to regctl or
// the SDK could miss a regnode they were not told of.
//
// The address announced is Config.AdvertiseAddress (advertise.go), by
// default the listener's, which is dialable except when its host is
// unspecified: a regnode on 0.0.0.0:7400 announcing "0.0.0.0:7400" would
// be dialed by every peer as the peer itself (and every such regnode
// would write the same key). For that case advertise.go chooses the
// host's address, or refuses to start where it cannot tell.

// nodesKey is where the announcements live.
func nodesKey(prefix string) string { return prefix + "nodes/" }

// announce writes this regnode's announcement of addr (advertiseAddr)
// under a new session; the session is returned for keepAnnounced to hold.
func (n *Node) announce(ctx context.Context, addr string) (*concurrency.Session, error) {
	ttl := int(n.cfg.SessionTTL / time.Second)
	if ttl <= 0 {
		ttl = 10
	}
	// The grant honours ctx; the session itself lives on the client's
	// context, so that Close can still revoke it while the regnode stops.
	lr, err := n.cli.Grant(ctx, int64(ttl))
	if err != nil {
		return nil, fmt.Errorf("grant the lease of the regnode announcement: %w", err)
	}
	sess, err := concurrency.NewSession(n.cli, concurrency.WithTTL(ttl), concurrency.WithLease(lr.ID))
	if err != nil {
		return nil, fmt.Errorf("open the session of the regnode announcement: %w", err)
	}
	pctx, cancel := context.WithTimeout(ctx, 10*time.Second)
	defer cancel()
	if _, err := n.cli.Put(pctx, nodesKey(n.cfg.Prefix)+addr, shard.Announcement{Name: n.cfg.Name, Zone: n.cfg.Zone}.Encode(), clientv3.WithLease(sess.Lease())); err != nil {
		sess.Close()
		return nil, fmt.Errorf("announce regnode %s at %s: %w", n.cfg.Name, addr, err)
	}
	return sess, nil
}

// keepAnnounced holds sess until ctx ends, when the regnode stops (then
// revokes it: the key goes at once), announcing again whenever the session
// is lost, and putting the key back under the same session when the
// membership shows it gone while the session lives (deleted by hand):
// without it this regnode would own no share of the probing.
func (n *Node) keepAnnounced(ctx context.Context, sess *concurrency.Session, addr string) {
	for {
		var changed <-chan struct{}
		if n.shards != nil {
			var v *shard.View
			v, changed = n.shards.members.View()
			if v != nil && v.Self < 0 && ctx.Err() == nil {
				n.log.Warn("regnode announcement gone while its session lives; announcing again", "node", n.cfg.Name)
				pctx, cancel := context.WithTimeout(ctx, 10*time.Second)
				_, err := n.cli.Put(pctx, nodesKey(n.cfg.Prefix)+addr, shard.Announcement{Name: n.cfg.Name, Zone: n.cfg.Zone}.Encode(), clientv3.WithLease(sess.Lease()))
				cancel()
				if err != nil {
					n.log.Warn("announce again", "err", err)
					retry := make(chan struct{}) // try again in a second
					time.AfterFunc(time.Second, func() { close(retry) })
					changed = retry
				}
			}
		}
		select {
		case <-ctx.Done():
			sess.Close()
			return
		case <-changed:
			continue
		case <-sess.Done():
		}
		n.log.Warn("regnode announcement session lost; announcing again", "node", n.cfg.Name)
		for {
			s, err := n.announce(ctx, addr)
			if err == nil {
				sess = s
				break
			}
			select {
			case <-ctx.Done():
				return
			case <-time.After(time.Second):
			}
		}
	}
}

// peers lists the regnodes announced (this one included).
func (n *Node) peers(ctx context.Context) ([]server.Peer, error) {
	key := nodesKey(n.cfg.Prefix)
	resp, err := n.cli.Get(ctx, key, clientv3.WithPrefix())
	if err != nil {
		return nil, err
	}
	out := make([]server.Peer, 0, len(resp.Kvs))
	for _, kv := range resp.Kvs {
		out = append(out, server.Peer{Name: shard.Decode(kv.Value).Name, Addr: strings.TrimPrefix(string(kv.Key), key)})
	}
	return out, nil
}

// dialPeer connects to another regnode's API: plaintext, or TLS with this
// regnode's trusted CA as roots and its own key pair as the client
// certificate (what --client-cert-auth asks of a peer).
func (n *Node) dialPeer(addr string) (registryv1.RegistryClient, func(), error) {
	creds := insecure.NewCredentials()
	if n.cfg.TLS.Enabled() {
		tc, err := tlsfiles.Client{CAFile: n.cfg.TLS.TrustedCAFile, CertFile: n.cfg.TLS.CertFile, KeyFile: n.cfg.TLS.KeyFile}.Config(n.log)
		if err != nil {
			return nil, nil, fmt.Errorf("TLS to regnode %s: %w", addr, err)
		}
		creds = credentials.NewTLS(tc)
	}
	cc, err := grpc.NewClient(addr, grpc.WithTransportCredentials(creds))
	if err != nil {
		return nil, nil, fmt.Errorf("connect to regnode %s: %w", addr, err)
	}
	return registryv1.NewRegistryClient(cc), func() { cc.Close() }, nil
}
