package render

import (
	"fmt"
	"io"
	"strconv"
	"strings"
	"time"

	registryv1 "github.com/regcluster/registry/proto/registry/v1"
)

// XdsClients is the JSON form of an XdsClientsResponse, as `regctl xds
// clients -o json` prints it and GET /api/v1/xds/clients answers: each
// regnode asked, with its xDS streams or the error asking it.
type XdsClients struct {
	Nodes []XdsNode `json:"nodes"`
}

// XdsNode is one regnode's xDS streams in XdsClients.
type XdsNode struct {
	Node    string `json:"node"`
	Address string `json:"address"`
	// Error says why the regnode could not be asked ("": it answered).
	Error   string      `json:"error,omitempty"`
	Clients []XdsClient `json:"clients"`
}

// XdsClient is one xDS stream.
type XdsClient struct {
	Node      string `json:"node"` // the regnode serving it
	StreamID  int64  `json:"stream_id"`
	NodeID    string `json:"node_id"`
	Kind      string `json:"kind"` // grpc, envoy or other
	UserAgent string `json:"user_agent"`
	Peer      string `json:"peer"`
	Protocol  string `json:"protocol"` // sotw or delta
	// Services are those whose endpoints it follows, by name.
	Services []XdsFollowed `json:"services"`
	// Behind: it has not acknowledged the latest endpoints of one of them.
	Behind    bool      `json:"behind"`
	NACKs     int64     `json:"nacks"`
	LastNACK  string    `json:"last_nack"`
	Connected time.Time `json:"connected,omitzero"`
}

// XdsFollowed is one service an xDS stream follows: the revision of the
// endpoints it acknowledged, the revision of those the regnode serves.
type XdsFollowed struct {
	Service       string `json:"service"`
	AckedRevision int64  `json:"acked_revision"`
	Revision      int64  `json:"revision"`
	Behind        bool   `json:"behind"`
}

// NewXdsClients converts an XdsClientsResponse to its JSON form.
func NewXdsClients(r *registryv1.XdsClientsResponse) XdsClients {
	out := XdsClients{Nodes: make([]XdsNode, 0, len(r.GetNodes()))}
	for _, n := range r.GetNodes() {
		xn := XdsNode{Node: n.GetNode(), Address: n.GetAddress(), Error: n.GetError(), Clients: make([]XdsClient, 0, len(n.GetClients()))}
		for _, c := range n.GetClients() {
			xc := XdsClient{Node: c.GetNode(), StreamID: c.GetStreamId(), NodeID: c.GetNodeId(), Kind: c.GetKind(),
				UserAgent: c.GetUserAgent(), Peer: c.GetPeer(), Protocol: c.GetProtocol(), NACKs: c.GetNacks(),
				LastNACK: c.GetLastNack(), Connected: timeOf(c.GetConnected()), Services: make([]XdsFollowed, 0, len(c.GetServices()))}
			if xc.Node == "" {
				xc.Node = xn.Node
			}
			for _, f := range c.GetServices() {
				behind := f.GetBehind() || f.GetAckedRevision() < f.GetRevision()
				xc.Services = append(xc.Services, XdsFollowed{Service: f.GetService(), AckedRevision: f.GetAckedRevision(),
					Revision: f.GetRevision(), Behind: behind})
				xc.Behind = xc.Behind || behind
			}
			xn.Clients = append(xn.Clients, xc)
		}
		out.Nodes = append(out.Nodes, xn)
	}
	return out
}

// WriteXdsClients writes the xDS streams of v as a table, one row a
// stream: the regnode, the client's node id and kind, the services it
// follows, the revision of each it acknowledged, those it has not
// applied the latest of ("no" if none: "orders 12<15"), its NACKs and the
// last NACK's error. wide adds the stream id, protocol, peer, user agent
// and how long it has been connected. The regnodes' errors are not
// written (see XdsErrors).
func WriteXdsClients(w io.Writer, v XdsClients, wide bool, now time.Time) error {
	header := []string{"REGNODE", "NODE-ID", "KIND", "SERVICES", "ACKED", "BEHIND", "NACKS", "LAST-NACK"}
	if wide {
		header = append(header, "STREAM", "PROTOCOL", "PEER", "USER-AGENT", "CONNECTED")
	}
	t := NewTable(w, header...)
	for _, n := range v.Nodes {
		for _, c := range n.Clients {
			var svcs, acked, behind []string
			for _, f := range c.Services {
				svcs = append(svcs, f.Service)
				acked = append(acked, strconv.FormatInt(f.AckedRevision, 10))
				if f.Behind {
					behind = append(behind, fmt.Sprintf("%s %d<%d", f.Service, f.AckedRevision, f.Revision))
				}
			}
			b := "no"
			if len(behind) > 0 {
				b = strings.Join(behind, ",")
			}
			row := []string{c.Node, c.NodeID, c.Kind, strings.Join(svcs, ","), strings.Join(acked, ","), b,
				strconv.FormatInt(c.NACKs, 10), c.LastNACK}
			if wide {
				age := ""
				if !c.Connected.IsZero() {
					age = Age(now.Sub(c.Connected))
				}
				row = append(row, strconv.FormatInt(c.StreamID, 10), c.Protocol, c.Peer, c.UserAgent, age)
			}
			t.Row(row...)
		}
	}
	return t.Flush()
}

// XdsErrors are the regnodes of v that could not be asked, one line each:
// "regnode NAME (ADDRESS): ERROR".
func XdsErrors(v XdsClients) []string {
	var out []string
	for _, n := range v.Nodes {
		if n.Error != "" {
			out = append(out, fmt.Sprintf("regnode %s (%s): %s", n.Node, n.Address, escape(n.Error)))
		}
	}
	return out
}
