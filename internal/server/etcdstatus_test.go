package server

import (
	"context"
	"errors"
	"fmt"
	"testing"

	"go.etcd.io/etcd/api/v3/v3rpc/rpctypes"
	clientv3 "go.etcd.io/etcd/client/v3"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	"github.com/regcluster/registry/internal/txnbatch"
	"github.com/regcluster/registry/record"
)

// Errors tell the truth: what another try or another regnode can fix is
// Unavailable (the SDK retries it); what the caller got wrong says so; a
// request etcd refuses, and anything that is not etcd's, is Internal (a
// bug of ours the SDK must not retry forever). The etcd errors are the
// ones clientv3 returns (rpctypes.Error of the server's status), wrapped as
// store wraps them.
func TestToStatusTellsTheTruth(t *testing.T) {
	wrap := func(err error) error { return fmt.Errorf("register orders/a: %w", err) }
	for _, tc := range []struct {
		name string
		err  error
		want codes.Code
	}{
		{"no leader", wrap(rpctypes.Error(rpctypes.ErrGRPCNoLeader)), codes.Unavailable},
		{"leader changed", wrap(rpctypes.Error(rpctypes.ErrGRPCLeaderChanged)), codes.Unavailable},
		{"etcd request timed out", wrap(rpctypes.Error(rpctypes.ErrGRPCTimeout)), codes.Unavailable},
		{"too many requests", wrap(rpctypes.Error(rpctypes.ErrGRPCRequestTooManyRequests)), codes.ResourceExhausted},
		{"transport down", wrap(status.Error(codes.Unavailable, "connection refused")), codes.Unavailable},
		{"no endpoint", wrap(clientv3.ErrNoAvailableEndpoints), codes.Unavailable},
		{"write path closing", wrap(txnbatch.ErrClosed), codes.Unavailable},
		{"etcd refused our credentials", wrap(rpctypes.Error(rpctypes.ErrGRPCPermissionDenied)), codes.Unavailable},
		{"etcd token expired", wrap(rpctypes.Error(rpctypes.ErrGRPCInvalidAuthToken)), codes.Unavailable},
		{"request too large for etcd", wrap(rpctypes.Error(rpctypes.ErrGRPCRequestTooLarge)), codes.Internal},
		{"duplicate key in our txn", wrap(rpctypes.Error(rpctypes.ErrGRPCDuplicateKey)), codes.Internal},
		{"lease etcd does not have", wrap(rpctypes.Error(rpctypes.ErrGRPCLeaseNotFound)), codes.Internal},
		{"a bug of ours", errors.New("unexpected 3 responses to a 2-op txn"), codes.Internal},
		{"the caller's input", wrap(&record.FieldError{Field: "weight", Reason: "0 is outside 1..1000"}), codes.InvalidArgument},
		{"not found", wrap(record.ErrNotFound), codes.NotFound},
		{"deadline", wrap(context.DeadlineExceeded), codes.DeadlineExceeded},
		{"our own status", status.Error(codes.FailedPrecondition, "not the leader"), codes.FailedPrecondition},
	} {
		got := status.Code(toStatus(tc.err))
		if got != tc.want {
			t.Errorf("%s: %v -> %s, want %s", tc.name, tc.err, got, tc.want)
		}
	}
}
