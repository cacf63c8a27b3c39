package node

import (
	"context"
	"fmt"
	"net"
	"net/http"

	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials/insecure"

	"github.com/regcluster/registry/dashboard"
	"github.com/regcluster/registry/httpapi"
	"github.com/regcluster/registry/internal/stopper"
)

// mountWeb mounts the JSON API (/api/v1/) and the dashboard (/) on the
// HTTP port beside /metrics.
//
// The API calls this regnode's own gRPC API over a loopback connection,
// so HTTP calls pass the same interceptors (metrics, and with --auth the
// token check) as any gRPC client. The connection is closed when the node starts
// to stop, which also ends every SSE watch at once.
//
// Each call carries its HTTP caller's address (server.Forwarder), which
// the gRPC API judges in place of this loopback connection's: the
// operator rule (a Deregister without the secret from this host only,
// without --auth), the per-peer limits and the audit line see the HTTP
// caller. Registration, keepalive and the owner's deregistration over
// HTTP follow the gRPC API's rules alone, as a gRPC client's would.
//
// Drain and undrain are allowed when the HTTP port listens on loopback
// alone, or with --auth (each call then needs the caller's token, which
// the HTTP API forwards from its Authorization header): without auth,
// anyone who can reach a wider listener could drain instances. Elsewhere
// the API and the dashboard are read-only. With --auth the dashboard asks
// for a token and sends it with each call.
func (n *Node) mountWeb(ctx context.Context, mux *http.ServeMux) error {
	target := loopbackTarget(n.lis.Addr())
	opts := []grpc.DialOption{grpc.WithTransportCredentials(insecure.NewCredentials())}
	if n.self != nil { // the API serves TLS: call it in memory (self.go)
		target = "passthrough:///regnode-self"
		opts = append(opts, grpc.WithContextDialer(n.self.dial))
	}
	conn, err := grpc.NewClient(target, opts...)
	if err != nil {
		return fmt.Errorf("connect the HTTP API to the gRPC API at %s: %w", target, err)
	}
	if err := n.life.Start(ctx, stopper.Component{Name: "HTTP API's connection", Quiesce: true,
		Run: func(ctx context.Context) error { <-ctx.Done(); return conn.Close() }}); err != nil {
		conn.Close()
		return err
	}
	readOnly := !isLoopback(n.mlis.Addr()) && !n.cfg.Auth
	api, err := httpapi.New(httpapi.Config{Conn: conn, ReadOnly: readOnly, Logger: n.log,
		Caller: func(ctx context.Context, r *http.Request) context.Context {
			return n.forward.Outgoing(ctx, r.RemoteAddr)
		}})
	if err != nil {
		return err
	}
	mux.Handle(httpapi.Prefix, api)
	dash, err := dashboard.New(dashboard.Config{ReadOnly: readOnly, Auth: n.cfg.Auth})
	if err != nil {
		return err
	}
	mux.Handle("/", dash)
	return nil
}

// loopbackTarget is where to dial a listener from the same host: its own
// address, with an unspecified host (0.0.0.0, ::) replaced by loopback.
func loopbackTarget(a net.Addr) string {
	ta, ok := a.(*net.TCPAddr)
	if !ok {
		return a.String()
	}
	ip := ta.IP
	if ip == nil || ip.IsUnspecified() {
		ip = net.IPv4(127, 0, 0, 1)
		if ta.IP != nil && ta.IP.To4() == nil {
			ip = net.IPv6loopback
		}
	}
	return net.JoinHostPort(ip.String(), fmt.Sprint(ta.Port))
}

// isLoopback reports whether a listener accepts connections from this
// host only.
func isLoopback(a net.Addr) bool {
	ta, ok := a.(*net.TCPAddr)
	return ok && ta.IP != nil && ta.IP.IsLoopback()
}
