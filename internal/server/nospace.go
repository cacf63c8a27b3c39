package server

import (
	"errors"

	"go.etcd.io/etcd/api/v3/v3rpc/rpctypes"
	"google.golang.org/genproto/googleapis/rpc/errdetails"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
)

// NoSpaceReason is the errdetails.ErrorInfo reason (domain NoSpaceDomain)
// of a write refused because etcd is out of space: its backend reached
// --quota-backend-bytes and raised the NOSPACE alarm. Reads, keepalives and
// deletes go on; writes that add data fail until an operator compacts,
// defragments and disarms the alarm (etcdctl alarm disarm).
const (
	NoSpaceReason = "NOSPACE"
	NoSpaceDomain = "etcd.io"
)

// noSpace reports whether err is etcd refusing a write for lack of space.
func noSpace(err error) bool {
	return errors.Is(err, rpctypes.ErrNoSpace) || errors.Is(err, rpctypes.ErrGRPCNoSpace)
}

// noSpaceStatus is ResourceExhausted, with an ErrorInfo that tells it from
// other exhausted resources (rate limits).
func noSpaceStatus(err error) error {
	st := status.New(codes.ResourceExhausted, "etcd is out of space (NOSPACE alarm): writes are refused until an operator compacts, defragments and disarms it; reads go on: "+err.Error())
	if d, derr := st.WithDetails(&errdetails.ErrorInfo{Reason: NoSpaceReason, Domain: NoSpaceDomain}); derr == nil {
		st = d
	}
	return st.Err()
}

// IsNoSpace reports whether err, a gRPC status from this server, is a write
// refused because etcd is out of space.
func IsNoSpace(err error) bool {
	st, ok := status.FromError(err)
	if !ok || st.Code() != codes.ResourceExhausted {
		return false
	}
	for _, d := range st.Details() {
		if info, ok := d.(*errdetails.ErrorInfo); ok && info.Reason == NoSpaceReason && info.Domain == NoSpaceDomain {
			return true
		}
	}
	return false
}
