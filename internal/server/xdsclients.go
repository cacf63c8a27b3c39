package server

import (
	"context"
	"fmt"
	"sync"

	registryv1 "github.com/regcluster/registry/proto/registry/v1"
)

// XDSLister is what XdsClients asks of this regnode's xDS server: its
// streams as the API reports them (their node, this regnode's name,
// left to XdsClients).
type XDSLister interface {
	XdsClients() []*registryv1.XdsClient
}

// XdsClients lists the xDS streams this regnode serves (Config.XDSList;
// none without it) or, with all, every regnode's that Config.Peers names,
// each asked for its own: a regnode that cannot be asked is listed with
// its error, and the others still answer.
func (s *Server) XdsClients(ctx context.Context, req *registryv1.XdsClientsRequest) (*registryv1.XdsClientsResponse, error) {
	if !req.All || s.cfg.Peers == nil {
		return &registryv1.XdsClientsResponse{Nodes: []*registryv1.NodeXdsClients{s.localXDS()}}, nil
	}
	peers, err := s.cfg.Peers(ctx)
	if err != nil {
		return nil, toStatus(fmt.Errorf("list the regnodes: %w", err))
	}
	nodes := []*registryv1.NodeXdsClients{s.localXDS()}
	others := make([]*registryv1.NodeXdsClients, 0, len(peers))
	var wg sync.WaitGroup
	for _, p := range peers {
		if p.Addr == s.cfg.Addr {
			continue
		}
		others = append(others, nil)
		wg.Add(1)
		go func(i int, p Peer) {
			defer wg.Done()
			others[i] = s.askPeerXDS(ctx, p)
		}(len(others)-1, p)
	}
	wg.Wait()
	return &registryv1.XdsClientsResponse{Nodes: append(nodes, others...)}, nil
}

// localXDS is this regnode's part of an XdsClients answer.
func (s *Server) localXDS() *registryv1.NodeXdsClients {
	n := &registryv1.NodeXdsClients{Node: s.cfg.Node, Address: s.cfg.Addr}
	if s.cfg.XDSList != nil {
		n.Clients = s.cfg.XDSList.XdsClients()
	}
	for _, c := range n.Clients {
		c.Node = s.cfg.Node
	}
	return n
}

// askPeerXDS asks another regnode for its xDS streams, within
// CallTimeout, with the caller's token.
func (s *Server) askPeerXDS(ctx context.Context, p Peer) *registryv1.NodeXdsClients {
	fail := func(err error) *registryv1.NodeXdsClients {
		return &registryv1.NodeXdsClients{Node: p.Name, Address: p.Addr, Error: err.Error()}
	}
	var resp *registryv1.XdsClientsResponse
	err := s.callPeer(ctx, p, s.cfg.CallTimeout, func(ctx context.Context, cli registryv1.RegistryClient) (err error) {
		resp, err = cli.XdsClients(ctx, &registryv1.XdsClientsRequest{})
		return err
	})
	if err != nil {
		return fail(err)
	}
	if len(resp.Nodes) != 1 {
		return fail(fmt.Errorf("answered for %d regnodes, not 1", len(resp.Nodes)))
	}
	n := resp.Nodes[0]
	if n.Node == "" {
		n.Node = p.Name
	}
	if n.Address == "" {
		n.Address = p.Addr
	}
	for _, c := range n.Clients {
		if c.Node == "" {
			c.Node = n.Node
		}
	}
	return n
}
