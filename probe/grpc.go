package probe

import (
	"context"
	"strings"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/backoff"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/connectivity"
	"google.golang.org/grpc/credentials/insecure"
	healthpb "google.golang.org/grpc/health/grpc_health_v1"
	"google.golang.org/grpc/status"

	"github.com/regcluster/registry/health"
)

// grpcDialOptions are the Checker's own options for its ClientConns.
//
// A cached ClientConn reconnects in the background with backoff. gRPC's
// default backoff grows to two minutes, so an instance that came back would
// still fail its probes for up to two minutes; capped at one second, a
// probe sees a recovered instance within about a second.
func grpcDialOptions() []grpc.DialOption {
	return []grpc.DialOption{
		grpc.WithTransportCredentials(insecure.NewCredentials()),
		grpc.WithNoProxy(),
		grpc.WithUserAgent(UserAgent),
		grpc.WithConnectParams(grpc.ConnectParams{
			Backoff: backoff.Config{
				BaseDelay:  100 * time.Millisecond,
				Multiplier: 1.6,
				Jitter:     0.2,
				MaxDelay:   time.Second,
			},
			MinConnectTimeout: 5 * time.Second,
		}),
	}
}

// conn returns the cached ClientConn to address, creating it (without I/O)
// on first use.
func (p *Checker) conn(address string) (*grpc.ClientConn, error) {
	p.mu.Lock()
	defer p.mu.Unlock()
	if cc := p.mu.conns[address]; cc != nil {
		return cc, nil
	}
	cc, err := grpc.NewClient("passthrough:///"+address, p.grpcOpts...)
	if err != nil {
		return nil, err
	}
	p.mu.conns[address] = cc
	return cc, nil
}

// probeGRPC calls grpc.health.v1.Health/Check for service on address.
// SERVING is OK; any other answer is Unhealthy, named as the protocol names
// it ("NOT_SERVING", "SERVICE_UNKNOWN"); a server without the health
// service is Unhealthy ("health service not implemented"). The RPC fails
// fast while the connection is down, so a refused connection is an Error,
// not a wait for the timeout.
func (p *Checker) probeGRPC(ctx context.Context, address, service string, timeout time.Duration) (health.Outcome, string) {
	cc, err := p.conn(address)
	if err != nil {
		return health.Error, "gRPC client: " + err.Error()
	}
	if cc.GetState() == connectivity.TransientFailure {
		// Reconnect now rather than after the backoff: this probe reports
		// the last failure, the next one sees a fresh attempt.
		cc.ResetConnectBackoff()
	}
	resp, err := healthpb.NewHealthClient(cc).Check(ctx, &healthpb.HealthCheckRequest{Service: service})
	if err != nil {
		return grpcFailure(ctx, err, timeout)
	}
	if s := resp.GetStatus(); s != healthpb.HealthCheckResponse_SERVING {
		return health.Unhealthy, s.String()
	}
	return health.OK, ""
}

// grpcFailure classifies a failed Check.
func grpcFailure(ctx context.Context, err error, timeout time.Duration) (health.Outcome, string) {
	if isTimeout(ctx, err) {
		return health.Timeout, timeoutDetail(timeout)
	}
	if ctx.Err() != nil {
		return health.Error, "probe canceled"
	}
	st := status.Convert(err)
	msg := st.Message()
	switch st.Code() {
	case codes.Unimplemented:
		return health.Unhealthy, "health service not implemented"
	case codes.NotFound: // grpc-go's health server: the service is not registered
		return health.Unhealthy, healthpb.HealthCheckResponse_SERVICE_UNKNOWN.String()
	case codes.Unavailable:
		// The connection failed; its cause is only in the message.
		for _, known := range []string{"connection refused", "connection reset", "no such host", "network is unreachable", "no route to host"} {
			if strings.Contains(msg, known) {
				return health.Error, known
			}
		}
		if strings.Contains(msg, "deadline exceeded") || strings.Contains(msg, "i/o timeout") {
			// A connect attempt that timed out earlier; this probe failed
			// fast on it, so it did not itself wait for the timeout.
			return health.Timeout, "connect timed out"
		}
	}
	return health.Error, "gRPC " + st.Code().String() + ": " + msg
}
