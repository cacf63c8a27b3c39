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
	"google.golang.org/grpc/metadata"
	"google.golang.org/grpc/status"

	"github.com/regcluster/registry/health"
)

// maxGRPCConns bounds the gRPC connections a Checker caches. Past it, a
// probe of an address without a cached connection makes one for itself
// and closes it when done, so however many gRPC instances a registry
// holds, the Checker keeps at most this many connections open between
// probes.
const maxGRPCConns = 512

// ProberMetadata is the gRPC metadata key carrying the name of the regnode
// that sends a probe (Config.Agent.Node). The user-agent key itself is
// grpc-go's: it starts with Agent.String() and ends with grpc-go's name.
const ProberMetadata = "x-registry-prober"

// grpcDialOptions are the Checker's own options for its ClientConns, which
// introduce themselves as userAgent.
//
// A cached ClientConn reconnects in the background with backoff. gRPC's
// default backoff grows to two minutes, so an instance that came back would
// still fail its probes for up to two minutes; capped at one second, a
// probe sees a recovered instance within about a second.
func grpcDialOptions(userAgent string) []grpc.DialOption {
	return []grpc.DialOption{
		grpc.WithTransportCredentials(insecure.NewCredentials()),
		grpc.WithNoProxy(),
		grpc.WithUserAgent(userAgent),
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

// grpcConn is a cached ClientConn.
type grpcConn struct {
	cc    *grpc.ClientConn
	users int       // probes using it now
	used  time.Time // when a probe last let go of it
}

// conn returns a ClientConn to address, made (without I/O) on first use,
// and the function to call when the probe is done with it. The connection
// is the cached one, unless the cache is full: then it is the probe's own,
// closed by done.
func (p *Checker) conn(address string) (cc *grpc.ClientConn, done func(), err error) {
	p.mu.Lock()
	if c := p.mu.conns[address]; c != nil {
		c.users++
		p.mu.Unlock()
		return c.cc, func() { p.release(c) }, nil
	}
	if len(p.mu.conns) >= p.grpcMax {
		p.mu.Unlock()
		cc, err := grpc.NewClient("passthrough:///"+address, p.grpcOpts...)
		if err != nil {
			return nil, nil, err
		}
		return cc, func() { p.closeConn(address, cc) }, nil
	}
	defer p.mu.Unlock()
	cc, err = grpc.NewClient("passthrough:///"+address, p.grpcOpts...)
	if err != nil {
		return nil, nil, err
	}
	c := &grpcConn{cc: cc, users: 1}
	p.mu.conns[address] = c
	if p.mu.stop == nil {
		p.mu.stop = make(chan struct{})
		p.sweeper.Add(1)
		go p.sweep(p.mu.stop)
	}
	return cc, func() { p.release(c) }, nil
}

// release ends a probe's use of a cached connection.
func (p *Checker) release(c *grpcConn) {
	p.mu.Lock()
	defer p.mu.Unlock()
	c.users--
	c.used = time.Now()
}

// sweep closes the cached connections no probe has used for grpcIdle (an
// instance that left without Forget, or probed seldom), until stop closes.
// While a ClientConn is cached it reconnects in the background to an
// address that stopped answering: the sweep ends that too.
func (p *Checker) sweep(stop <-chan struct{}) {
	defer p.sweeper.Done()
	t := time.NewTicker(max(p.grpcIdle/4, time.Millisecond))
	defer t.Stop()
	for {
		select {
		case <-stop:
			return
		case now := <-t.C:
			p.evictIdle(now)
		}
	}
}

// evictIdle closes the cached connections idle since before now-grpcIdle.
func (p *Checker) evictIdle(now time.Time) {
	idle := make(map[string]*grpc.ClientConn)
	p.mu.Lock()
	for addr, c := range p.mu.conns {
		if c.users == 0 && now.Sub(c.used) >= p.grpcIdle {
			idle[addr] = c.cc
			delete(p.mu.conns, addr)
		}
	}
	p.mu.Unlock()
	for addr, cc := range idle {
		p.closeConn(addr, cc)
	}
}

// closeConn closes a connection no longer cached, logging a failure.
func (p *Checker) closeConn(address string, cc *grpc.ClientConn) {
	if err := cc.Close(); err != nil {
		p.log.Warn("probe: closing gRPC connection", "address", address, "err", err)
	}
}

// probeGRPC calls grpc.health.v1.Health/Check for service on address.
// SERVING is OK; any other answer is Unhealthy, named as the protocol names
// it ("NOT_SERVING", "SERVICE_UNKNOWN"); a server without the health
// service is Unhealthy ("health service not implemented"). The RPC fails
// fast while the connection is down, so a refused connection is an Error,
// not a wait for the timeout.
func (p *Checker) probeGRPC(ctx context.Context, address, service string, timeout time.Duration) (health.Outcome, string) {
	cc, done, err := p.conn(address)
	if err != nil {
		return health.Error, "gRPC client: " + err.Error()
	}
	defer done()
	if cc.GetState() == connectivity.TransientFailure {
		// Reconnect now rather than after the backoff: this probe reports
		// the last failure, the next one sees a fresh attempt.
		cc.ResetConnectBackoff()
	}
	ctx = metadata.AppendToOutgoingContext(ctx, ProberMetadata, p.agent.Node)
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
