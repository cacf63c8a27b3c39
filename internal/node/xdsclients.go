package node

import (
	"google.golang.org/protobuf/types/known/timestamppb"

	registryv1 "github.com/regcluster/registry/proto/registry/v1"
	"github.com/regcluster/registry/xds"
)

// xdsList is the xDS server's streams as the API's XdsClients reports
// them (server.XDSLister).
type xdsList struct{ xs *xds.Server }

func (l xdsList) XdsClients() []*registryv1.XdsClient {
	cs := l.xs.Clients()
	out := make([]*registryv1.XdsClient, 0, len(cs))
	for _, c := range cs {
		pc := &registryv1.XdsClient{StreamId: c.StreamID, NodeId: c.NodeID, Kind: c.Kind, UserAgent: c.UserAgent,
			Peer: c.Peer, Protocol: c.Protocol, Nacks: int64(c.NACKs), LastNack: c.LastNACK,
			Connected: timestamppb.New(c.Connected)}
		for _, f := range c.Services {
			pc.Services = append(pc.Services, &registryv1.XdsFollowed{Service: f.Service, AckedRevision: f.Acked,
				Revision: f.Revision, Behind: f.Acked < f.Revision})
		}
		out = append(out, pc)
	}
	return out
}
