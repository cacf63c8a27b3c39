package node

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"errors"
	"fmt"
	"net"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	clientv3 "go.etcd.io/etcd/client/v3"
	"golang.org/x/time/rate"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/metadata"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/types/known/durationpb"

	"github.com/regcluster/registry/internal/server"
	"github.com/regcluster/registry/internal/shard"
	"github.com/regcluster/registry/internal/stopper"
	"github.com/regcluster/registry/prober"
	registryv1 "github.com/regcluster/registry/proto/registry/v1"
)

// Sharded probing (health at scale): every regnode probes the share of
// the checked instances that rendezvous hashing over the announcements
// gives it (package shard), its writes fenced by that membership. Before
// it evicts an instance it asks another regnode (of another zone where
// there is one) to probe it (ConfirmProbe), and it demotes nothing while
// its own canaries fail.

// canaryEvery is how often the canaries run; canaryEtcd is the etcd
// latency past which this regnode stops demoting (an etcd that slow
// makes probes' verdicts land late, and often means this host is in
// trouble); canaryDial bounds a connection to a peer.
const (
	canaryEvery = time.Second
	canaryEtcd  = time.Second
	canaryDial  = time.Second
)

// sharding is a regnode's part of sharded probing.
type sharding struct {
	n       *Node
	members *shard.Watcher
	self    string // this regnode's advertised address

	mu    sync.Mutex
	view  *shard.View
	share *prober.Share

	canary atomic.Pointer[string] // why the canaries fail; "" while they pass
	rate   atomic.Uint64          // probes per second ×1000, sampled by the canary loop
	asked  *rate.Limiter          // ConfirmProbe served

	connMu sync.Mutex
	conns  map[string]peerConn
}

type peerConn struct {
	cli   registryv1.RegistryClient
	close func()
}

// Share implements prober.Shares over the membership: the same *Share
// for the same view, so the prober sees a change only when it is one.
func (s *sharding) Share() (*prober.Share, <-chan struct{}) {
	v, changed := s.members.View()
	if v == nil {
		return nil, changed
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	if v != s.view {
		s.view = v
		s.share = &prober.Share{Rev: v.Rev, Owns: v.Owns, Guard: v.Guard(), Alone: v.Alone(), Fence: v.Rev}
		if v.Self < 0 {
			// Not announced (or the session was lost): nothing is ours.
			s.share.Owns = func(string, string) bool { return false }
		}
	}
	return s.share, changed
}

// newSharding is the sharding of a regnode announced at advertise; made
// before the announcement, which keepAnnounced holds by its membership.
func newSharding(n *Node, advertise string) *sharding {
	s := &sharding{n: n, self: advertise, members: shard.NewWatcher(n.cli, nodesKey(n.cfg.Prefix), advertise, n.log),
		asked: rate.NewLimiter(200, 200), conns: map[string]peerConn{}}
	s.canary.Store(new(string))
	return s
}

// startSharding starts following the membership and probing this
// regnode's share, once announced; the prober goes first when the regnode
// stops, with the announcement, so that the others take its share over.
func (n *Node) startSharding(ctx context.Context) error {
	s := n.shards
	if err := n.life.Start(ctx, stopper.Component{Name: "membership", Run: func(ctx context.Context) error { return s.members.Run(ctx) },
		Close: func() error { s.closeConns(); return nil }}); err != nil {
		return err
	}
	if err := n.life.Start(ctx, stopper.Component{Name: "canaries", Run: func(ctx context.Context) error { s.canaries(ctx); return nil }}); err != nil {
		return err
	}
	return n.life.Start(ctx, stopper.Component{Name: "prober", Quiesce: true,
		Run: func(ctx context.Context) error {
			select { // probe from a filled view
			case <-n.hub.Ready():
			case <-ctx.Done():
				return nil
			}
			if err := n.prober.Probe(ctx, s); err != nil && ctx.Err() == nil {
				return err
			}
			return nil
		}})
}

// canaries checks, every canaryEvery, what this regnode's verdicts rest
// on: etcd answers it in time, and some other regnode is reachable when
// there are others. While either fails, it demotes nothing.
func (s *sharding) canaries(ctx context.Context) {
	t := time.NewTicker(canaryEvery)
	defer t.Stop()
	last, lastAt := s.n.prober.Stats().Probes, time.Now()
	for {
		select {
		case <-ctx.Done():
			return
		case now := <-t.C:
			p := s.n.prober.Stats().Probes
			if d := now.Sub(lastAt); d > 0 {
				s.rate.Store(uint64(float64(p-last) / d.Seconds() * 1000))
			}
			last, lastAt = p, now
		}
		why := s.check(ctx)
		if old := *s.canary.Load(); old != why {
			if why != "" {
				s.n.log.Warn("canaries fail: this regnode demotes nothing until they pass", "why", why)
			} else {
				s.n.log.Info("canaries pass again: demotions resume", "was", old)
			}
		}
		s.canary.Store(&why)
	}
}

// check runs the canaries once: "" when they pass, else why not.
func (s *sharding) check(ctx context.Context) string {
	start := time.Now()
	gctx, cancel := context.WithTimeout(ctx, 2*canaryEtcd)
	_, err := s.n.cli.Get(gctx, nodesKey(s.n.cfg.Prefix)+s.self)
	cancel()
	took := time.Since(start)
	switch {
	case ctx.Err() != nil:
		return ""
	case err != nil:
		return fmt.Sprintf("etcd does not answer: %v", err)
	case took > canaryEtcd:
		return fmt.Sprintf("etcd answered in %s (over %s)", took.Round(time.Millisecond), canaryEtcd)
	}
	v, _ := s.members.View()
	if v == nil {
		return ""
	}
	others := 0
	for i, m := range v.Members {
		if i == v.Self {
			continue
		}
		others++
		var d net.Dialer
		dctx, cancel := context.WithTimeout(ctx, canaryDial)
		c, err := d.DialContext(dctx, "tcp", m.Key)
		cancel()
		if err == nil {
			c.Close()
			return ""
		}
	}
	if others > 0 {
		return fmt.Sprintf("none of the %d other regnodes is reachable", others)
	}
	return ""
}

// Canary is why the canaries fail ("" while they pass).
func (s *sharding) Canary() string { return *s.canary.Load() }

// confirm asks the other regnodes, in shard's order, to probe inst; the
// first that answers gives the verdict.
func (s *sharding) confirm(ctx context.Context, inst *registryv1.Instance) (prober.Verdict, error) {
	m := s.n.metrics
	v, _ := s.members.View()
	if v == nil {
		return prober.Verdict{}, errors.New("no membership yet")
	}
	var errs []error
	for _, peer := range v.Confirmers(inst.Service, inst.Id, s.n.cfg.Zone) {
		cli, err := s.conn(peer.Key)
		if err == nil {
			cctx := metadata.AppendToOutgoingContext(ctx, server.PeerHeader, s.n.peerSecret)
			var resp *registryv1.ConfirmProbeResponse
			resp, err = cli.ConfirmProbe(cctx, &registryv1.ConfirmProbeRequest{Service: inst.Service, Id: inst.Id, CreateRevision: inst.CreateRevision})
			if err == nil {
				if resp.Failing {
					m.Confirmations.WithLabelValues("confirmed").Inc()
				} else {
					m.Confirmations.WithLabelValues("disagreed").Inc()
				}
				return prober.Verdict{Failing: resp.Failing, Peer: resp.Node, Detail: strings.TrimSpace(resp.Outcome + " " + resp.Detail)}, nil
			}
		}
		errs = append(errs, fmt.Errorf("regnode %s at %s: %w", peer.Name, peer.Key, err))
		if ctx.Err() != nil {
			break
		}
	}
	m.Confirmations.WithLabelValues("error").Inc()
	if len(errs) == 0 {
		return prober.Verdict{}, errors.New("no other regnode to ask")
	}
	return prober.Verdict{}, errors.Join(errs...)
}

// conn is a kept connection to the regnode at addr.
func (s *sharding) conn(addr string) (registryv1.RegistryClient, error) {
	s.connMu.Lock()
	defer s.connMu.Unlock()
	if c, ok := s.conns[addr]; ok {
		return c.cli, nil
	}
	if s.conns == nil {
		return nil, errors.New("the regnode is stopping")
	}
	cli, closer, err := s.n.dialPeer(addr)
	if err != nil {
		return nil, err
	}
	s.conns[addr] = peerConn{cli: cli, close: closer}
	return cli, nil
}

func (s *sharding) closeConns() {
	s.connMu.Lock()
	defer s.connMu.Unlock()
	for _, c := range s.conns {
		c.close()
	}
	s.conns = nil
}

// serveConfirm is ConfirmProbe: a probe, at once, of the instance as
// this regnode's view holds it, never of an address the caller names.
func (s *sharding) serveConfirm(ctx context.Context, req *registryv1.ConfirmProbeRequest) (*registryv1.ConfirmProbeResponse, error) {
	if !s.asked.Allow() {
		return nil, status.Error(codes.ResourceExhausted, "too many ConfirmProbe calls on this regnode; try another")
	}
	in, ok := s.n.hub.Cache().Snapshot().Get(req.Service, req.Id)
	switch {
	case !ok:
		return nil, status.Errorf(codes.NotFound, "instance %s/%s is not in this regnode's view", req.Service, req.Id)
	case req.CreateRevision != 0 && in.CreateRevision != req.CreateRevision:
		return nil, status.Errorf(codes.FailedPrecondition, "instance %s/%s was registered anew (create revision %d, asked about %d)",
			req.Service, req.Id, in.CreateRevision, req.CreateRevision)
	case in.GetCheck().GetKind() == registryv1.CheckKind_CHECK_KIND_NONE:
		return nil, status.Errorf(codes.FailedPrecondition, "instance %s/%s has no health check", req.Service, req.Id)
	}
	th := s.n.cfg.Thresholds.With(in.Check)
	res := s.n.probe.Probe(ctx, in.Address, in.Check, th.Slow)
	return &registryv1.ConfirmProbeResponse{Node: s.n.cfg.Name, Failing: res.Outcome.Failure(), Outcome: res.Outcome.String(),
		Detail: res.Detail, Latency: durationpb.New(res.Latency)}, nil
}

// probing is this regnode's Probing for Status.
func (s *sharding) probing() *registryv1.Probing {
	st := s.n.prober.Stats()
	p := &registryv1.Probing{Node: s.n.cfg.Name, Address: s.self, Zone: s.n.cfg.Zone, Owned: st.Owned, Probes: st.Probes,
		ProbesPerSecond: float64(s.rate.Load()) / 1000, Disagreements: st.Disagreements, Held: st.Held, Canary: st.Canary}
	if v, _ := s.members.View(); v != nil {
		p.Members = int32(len(v.Members))
	}
	return p
}

// peerSecretKey holds the secret regnodes prove themselves to each other
// with (server.PeerHeader): in etcd, which only regnodes (and etcd's
// operators) may read.
func peerSecretKey(prefix string) string { return prefix + "peer-secret" }

// ensurePeerSecret reads the cluster's peer secret, creating it if no
// regnode has yet.
func (n *Node) ensurePeerSecret(ctx context.Context) (string, error) {
	b := make([]byte, 32)
	if _, err := rand.Read(b); err != nil {
		return "", fmt.Errorf("make a peer secret: %w", err)
	}
	key := peerSecretKey(n.cfg.Prefix)
	tctx, cancel := context.WithTimeout(ctx, 10*time.Second)
	defer cancel()
	resp, err := n.cli.Txn(tctx).If(clientv3.Compare(clientv3.CreateRevision(key), "=", 0)).
		Then(clientv3.OpPut(key, hex.EncodeToString(b))).Else(clientv3.OpGet(key)).Commit()
	if err != nil {
		return "", fmt.Errorf("read or create the peer secret %s: %w", key, err)
	}
	if resp.Succeeded {
		return hex.EncodeToString(b), nil
	}
	kvs := resp.Responses[0].GetResponseRange().Kvs
	if len(kvs) == 0 || len(kvs[0].Value) == 0 {
		return "", fmt.Errorf("the peer secret %s is empty", key)
	}
	return string(kvs[0].Value), nil
}
