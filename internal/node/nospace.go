package node

import (
	"context"
	"time"

	"golang.org/x/time/rate"
	"google.golang.org/grpc"
	"google.golang.org/grpc/status"

	"github.com/regcluster/registry/internal/server"
)

// noSpaceLog logs, at error and at most once a minute, that writes are
// refused because etcd is out of space: one clear line an operator sees,
// not one per refused call (each is still counted by method and code).
func (n *Node) noSpaceLog() grpc.UnaryServerInterceptor {
	every := &rate.Sometimes{First: 1, Interval: time.Minute}
	return func(ctx context.Context, req any, info *grpc.UnaryServerInfo, h grpc.UnaryHandler) (any, error) {
		resp, err := h(ctx, req)
		if err != nil && server.IsNoSpace(err) {
			every.Do(func() {
				n.log.Error("etcd is out of space: writes are refused, reads go on serving; "+
					"compact and defragment etcd, or raise --quota-backend-bytes, then disarm the NOSPACE alarm (etcdctl alarm disarm)",
					"method", info.FullMethod, "quota_backend_bytes", n.cfg.Embed.QuotaBackendBytes, "err", status.Convert(err).Message())
			})
		}
		return resp, err
	}
}
