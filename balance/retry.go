package balance

import (
	"context"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	"github.com/regcluster/registry/internal/backoff"
)

// UnaryClientInterceptor retries a unary call on another instance, as the
// channel's policy says (MaxRetries, Idempotent, the retry budget). It
// needs this package's balancer on the channel: the picker tells it the
// policy and which instances the call already tried, and without it no
// call is retried. All attempts share the caller's deadline.
func UnaryClientInterceptor() grpc.UnaryClientInterceptor {
	return func(ctx context.Context, method string, req, reply any, cc *grpc.ClientConn, invoker grpc.UnaryInvoker, opts ...grpc.CallOption) error {
		if callFrom(ctx) != nil { // already inside one of ours
			return invoker(ctx, method, req, reply, cc, opts...)
		}
		c := newCall(ctx)
		ctx = c
		for n := 0; ; n++ {
			before := c.count()
			err := invoker(ctx, method, req, reply, cc, opts...)
			if n == 0 {
				c.deposit()
			}
			if err == nil || !c.retry(ctx, method, err, n, before) {
				return err
			}
		}
	}
}

// StreamClientInterceptor retries the start of a stream (until
// grpc.ClientConn.NewStream returns) on another instance, as
// UnaryClientInterceptor does a unary call. Once a stream is open its
// messages are the caller's: they are never replayed.
func StreamClientInterceptor() grpc.StreamClientInterceptor {
	return func(ctx context.Context, desc *grpc.StreamDesc, cc *grpc.ClientConn, method string, streamer grpc.Streamer, opts ...grpc.CallOption) (grpc.ClientStream, error) {
		if callFrom(ctx) != nil {
			return streamer(ctx, desc, cc, method, opts...)
		}
		c := newCall(ctx)
		ctx = c
		for n := 0; ; n++ {
			before := c.count()
			cs, err := streamer(ctx, desc, cc, method, opts...)
			if n == 0 {
				c.deposit()
			}
			if err == nil || !c.retry(ctx, method, err, n, before) {
				return cs, err
			}
		}
	}
}

func (c *call) deposit() {
	if sh := c.shared(); sh != nil {
		sh.budget.call()
	}
}

// retry decides whether attempt n (0-based) that failed with err is
// retried, and waits the backoff if so. A call is retried only if the
// failed attempt certainly did not reach the application (no instance
// was picked, or not a byte was sent), or the method is idempotent and
// the error says the instance could not serve it; never past the
// caller's deadline, never beyond the budget, never on an instance
// already tried (the picker skips those, and says when none is left).
func (c *call) retry(ctx context.Context, method string, err error, n, before int) bool {
	sh := c.shared()
	if sh == nil || ctx.Err() != nil || c.isFinal() {
		return false
	}
	p := &sh.policy
	if n >= p.MaxRetries {
		return false
	}
	code := status.Code(err)
	switch {
	case code == codes.Unavailable && c.unprocessedSince(before):
	case p.IsIdempotent(method) && (code == codes.Unavailable || code == codes.DeadlineExceeded):
	default:
		return false
	}
	wait := retryWait(p, n)
	if dl, ok := ctx.Deadline(); ok && time.Until(dl) <= wait {
		return false // the caller's deadline bounds every attempt
	}
	if !sh.budget.tryRetry() {
		sh.metrics.budgetExhausted.Add(1)
		return false
	}
	sh.metrics.retries.Add(1)
	return backoff.Sleep(ctx, wait)
}

// retryWait is exponential from RetryBackoff, capped at RetryBackoffMax,
// with equal jitter (half fixed, half random) so that callers failed by
// one event do not retry in lockstep.
func retryWait(p *Policy, n int) time.Duration {
	return backoff.Exponential{Min: p.RetryBackoff, Max: p.RetryBackoffMax}.Delay(n)
}
