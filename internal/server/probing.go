package server

import (
	"context"
	"crypto/subtle"
	"errors"
	"sync"

	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/metadata"
	"google.golang.org/grpc/status"

	registryv1 "github.com/regcluster/registry/proto/registry/v1"
	"github.com/regcluster/registry/record"
)

// PeerHeader is the metadata key a regnode's own calls to another
// regnode (ConfirmProbe) carry the cluster's peer secret in: a regnode
// holds no token, and under --auth this is how a peer knows it.
const PeerHeader = "x-registry-peer"

// ConfirmProbe probes an instance at once from this regnode, from this
// regnode's own record of it (the caller names it, never an address): a
// regnode asks another before it evicts an instance.
func (s *Server) ConfirmProbe(ctx context.Context, req *registryv1.ConfirmProbeRequest) (*registryv1.ConfirmProbeResponse, error) {
	if err := record.ValidService(req.Service); err != nil {
		return nil, toStatus(&record.FieldError{Field: "service", Reason: err.Error()})
	}
	if err := record.ValidID(req.Id); err != nil {
		return nil, toStatus(&record.FieldError{Field: "id", Reason: err.Error()})
	}
	if s.cfg.Confirm == nil {
		return nil, status.Error(codes.Unimplemented, "this regnode does not probe")
	}
	return s.cfg.Confirm(ctx, req)
}

// probing is this regnode's Probing, and with peers every announced
// regnode's (asked with the caller's token, as WaitApplied asks).
func (s *Server) probing(ctx context.Context, peers bool) (*registryv1.Probing, []*registryv1.Probing) {
	if s.cfg.Probing == nil {
		return nil, nil
	}
	self := s.cfg.Probing()
	if !peers || s.cfg.Peers == nil {
		return self, nil
	}
	list, err := s.cfg.Peers(ctx)
	if err != nil {
		return self, nil
	}
	out := make([]*registryv1.Probing, len(list))
	var wg sync.WaitGroup
	for i, p := range list {
		if p.Addr == s.cfg.Addr {
			out[i] = self
			continue
		}
		wg.Go(func() { out[i] = s.askProbing(ctx, p) })
	}
	wg.Wait()
	return self, out
}

func (s *Server) askProbing(ctx context.Context, p Peer) *registryv1.Probing {
	fail := func(err error) *registryv1.Probing {
		return &registryv1.Probing{Node: p.Name, Address: p.Addr, Error: err.Error()}
	}
	if s.cfg.DialPeer == nil {
		return fail(errors.New("this regnode cannot call other regnodes"))
	}
	cli, closer, err := s.cfg.DialPeer(p.Addr)
	if err != nil {
		return fail(err)
	}
	defer closer()
	cctx, cancel := context.WithTimeout(ctx, s.cfg.CallTimeout)
	defer cancel()
	if md, ok := metadata.FromIncomingContext(ctx); ok {
		if v := md.Get("authorization"); len(v) > 0 {
			cctx = metadata.AppendToOutgoingContext(cctx, "authorization", v[0])
		}
	}
	resp, err := cli.Status(cctx, &registryv1.StatusRequest{})
	if err != nil {
		return fail(err)
	}
	if resp.Probing == nil {
		return fail(errors.New("it reports no probing (an older regnode?)"))
	}
	return resp.Probing
}

// AllowPeers lets a call of ConfirmProbe that carries secret in
// PeerHeader through without a token: another regnode's.
func (a *Auth) AllowPeers(secret string) {
	a.peerMu.Lock()
	a.peerSecret = secret
	a.peerMu.Unlock()
}

// fromPeer reports whether ctx carries the peer secret.
func (a *Auth) fromPeer(ctx context.Context) bool {
	a.peerMu.Lock()
	secret := a.peerSecret
	a.peerMu.Unlock()
	if secret == "" {
		return false
	}
	md, _ := metadata.FromIncomingContext(ctx)
	v := md.Get(PeerHeader)
	return len(v) == 1 && subtle.ConstantTimeCompare([]byte(v[0]), []byte(secret)) == 1
}
