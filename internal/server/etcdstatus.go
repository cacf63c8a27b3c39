package server

import (
	"errors"

	"go.etcd.io/etcd/api/v3/v3rpc/rpctypes"
	clientv3 "go.etcd.io/etcd/client/v3"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	"github.com/regcluster/registry/internal/leasepool"
	"github.com/regcluster/registry/internal/txnbatch"
)

// etcdStatus is the status of an error none of toStatus's registry cases
// matched: what etcd's answer, or its absence, means to our caller.
//
//   - etcd or the way to it is down, slow or busy (Unavailable,
//     DeadlineExceeded, ResourceExhausted, Aborted from etcd or the
//     transport; no endpoint; this regnode's write path closing as it
//     stops): Unavailable, so the SDK tries again or another regnode.
//   - etcd refused this regnode's credentials (PermissionDenied,
//     Unauthenticated): Unavailable too, naming it; the caller did
//     nothing wrong and another regnode may be configured right.
//   - etcd refused the request itself (InvalidArgument, FailedPrecondition,
//     NotFound, OutOfRange, ...): Internal. The registry validated the
//     caller's input first, so a request etcd refuses is this regnode's
//     bug, and retrying it forever would not help.
//   - an error that is not etcd's at all: Internal, for the same reason.
//
// A gRPC status our own code made (not etcd's) keeps its code.
func etcdStatus(err error) error {
	var ee rpctypes.EtcdError
	if errors.As(err, &ee) {
		switch ee.Code() {
		case codes.Unavailable, codes.DeadlineExceeded, codes.ResourceExhausted, codes.Aborted, codes.Canceled:
			return status.Error(ee.Code(), err.Error())
		case codes.PermissionDenied, codes.Unauthenticated:
			return status.Error(codes.Unavailable, "etcd refused this regnode's credentials (try another regnode; an operator must fix this one's): "+err.Error())
		default:
			return status.Error(codes.Internal, "etcd refused what this regnode asked ("+ee.Code().String()+"): "+err.Error())
		}
	}
	switch {
	case errors.Is(err, clientv3.ErrNoAvailableEndpoints),
		errors.Is(err, txnbatch.ErrClosed), errors.Is(err, leasepool.ErrClosed):
		return status.Error(codes.Unavailable, err.Error())
	}
	if s, ok := status.FromError(err); ok && s.Code() != codes.Unknown {
		return s.Err()
	}
	return status.Error(codes.Internal, err.Error())
}
