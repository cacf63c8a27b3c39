package probe

import (
	"context"
	"errors"
	"io"
	"net"
	"net/url"
	"os"
	"syscall"
	"time"

	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	"github.com/regcluster/registry/health"
)

// failure classifies the error of a TCP or HTTP probe: a timeout, a
// canceled probe, or an error described for a person.
func failure(ctx context.Context, err error, timeout time.Duration) (health.Outcome, string) {
	switch {
	case isTimeout(ctx, err):
		return health.Timeout, timeoutDetail(timeout)
	case ctx.Err() != nil:
		return health.Error, "probe canceled"
	}
	return health.Error, describe(err)
}

// isTimeout reports whether err is the probe's deadline passing, in any of
// the forms the standard library and gRPC give it.
func isTimeout(ctx context.Context, err error) bool {
	if errors.Is(err, context.DeadlineExceeded) || os.IsTimeout(err) {
		return true
	}
	var ne net.Error
	if errors.As(err, &ne) && ne.Timeout() {
		return true
	}
	if s, ok := status.FromError(err); ok && s.Code() == codes.DeadlineExceeded {
		return true
	}
	// The deadline passed while the error was being made (a read cut short
	// by the context): it is the timeout that ended the probe.
	return errors.Is(ctx.Err(), context.DeadlineExceeded)
}

func timeoutDetail(timeout time.Duration) string {
	return "timeout after " + health.FormatDuration(timeout)
}

// describe names a network error the way an operator says it: "connection
// refused", "connection reset", "DNS lookup of x: no such host".
func describe(err error) string {
	var dns *net.DNSError
	switch {
	case errors.Is(err, syscall.ECONNREFUSED):
		return "connection refused"
	case errors.Is(err, syscall.ECONNRESET):
		return "connection reset"
	case errors.Is(err, syscall.EHOSTUNREACH):
		return "no route to host"
	case errors.Is(err, syscall.ENETUNREACH):
		return "network is unreachable"
	case errors.Is(err, syscall.EPIPE):
		return "broken pipe"
	case errors.Is(err, io.EOF), errors.Is(err, io.ErrUnexpectedEOF):
		return "connection closed by the target"
	case errors.As(err, &dns):
		return "DNS lookup of " + dns.Name + ": " + dns.Err
	}
	// Drop `Get "http://...": ` and `dial tcp 10.0.0.1:80: `: the address
	// is known to whoever reads the detail.
	var ue *url.Error
	if errors.As(err, &ue) {
		err = ue.Err
	}
	var oe *net.OpError
	if errors.As(err, &oe) && oe.Err != nil {
		err = oe.Err
	}
	return err.Error()
}
