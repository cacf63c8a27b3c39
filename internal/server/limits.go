package server

import (
	"context"
	"errors"
	"strings"

	"github.com/regcluster/registry/internal/peerlimit"
	registryv1 "github.com/regcluster/registry/proto/registry/v1"
)

// LimitReason is the errdetails.ErrorInfo reason (domain ErrorDomain) of
// a ResourceExhausted from one of the per-key limits: "LIMIT_" and the
// limit's name in capitals (LIMIT_WRITE_RATE, LIMIT_KEEPALIVE_RATE,
// LIMIT_STREAMS, LIMIT_REGISTRATIONS); its metadata "limit" is the name.
// A RetryInfo comes with it when waiting is what helps.
func LimitReason(limit string) string { return "LIMIT_" + strings.ToUpper(limit) }

// The registrations a key holds (peerlimit's cap): claimed before
// Register writes, held once it has, released when this regnode learns
// the registration ended: its own Deregister, a KeepAlive told the lease
// is lost, or SweepHolds finding the record gone from the fan-out's view
// (deleted through another regnode, expired, revoked, or replaced under
// another lease). See package peerlimit for what a restart forgets.

// limitKey is the key registrations and writes in flight are counted
// under: the caller's, as limit keys the rate limits (Config.LimitKey:
// the peer's address, or with --auth the token's name).
func (s *Server) limitKey(ctx context.Context) string { return s.cfg.LimitKey(ctx) }

// slot is a Register's claim on a registration slot; a nil slot (no
// limits) does nothing.
type slot struct{ r *peerlimit.Reservation }

// reserve claims a slot of the caller for inst, or refuses the Register
// with ResourceExhausted (counted) when the caller holds its cap.
func (s *Server) reserve(ctx context.Context, inst *registryv1.Instance) (slot, error) {
	if s.cfg.Limits == nil {
		return slot{}, nil
	}
	r, err := s.cfg.Limits.Reserve(s.limitKey(ctx), peerlimit.Instance{Service: inst.GetService(), ID: inst.GetId()})
	if err != nil {
		var le *peerlimit.Error
		if errors.As(err, &le) {
			s.m.Limited.WithLabelValues(le.Limit).Inc()
		}
		return slot{}, toStatus(err)
	}
	return slot{r}, nil
}

// granted holds the slot for the registration written under lease at rev.
func (sl slot) granted(lease, rev int64) {
	if sl.r != nil {
		sl.r.Granted(lease, rev)
	}
}

// cancel gives the slot back: nothing was written.
func (sl slot) cancel() {
	if sl.r != nil {
		sl.r.Cancel()
	}
}

// ended releases the hold of service/id: deleted at rev.
func (s *Server) ended(service, id string, rev int64) {
	if s.cfg.Limits != nil {
		s.cfg.Limits.Ended(peerlimit.Instance{Service: service, ID: id}, rev)
	}
}

// lost releases the hold of service/id if it is under lease.
func (s *Server) lost(service, id string, lease int64) {
	if s.cfg.Limits != nil {
		s.cfg.Limits.Lost(peerlimit.Instance{Service: service, ID: id}, lease)
	}
}

// enterWrite waits for a place among the caller's writes in flight (see
// peerlimit.Limiter.EnterWrite); done ends the write. Its error is the
// call's own context ending while it waited.
func (s *Server) enterWrite(ctx context.Context) (done func(), err error) {
	if s.cfg.Limits == nil {
		return func() {}, nil
	}
	if done, err = s.cfg.Limits.EnterWrite(ctx, s.limitKey(ctx)); err != nil {
		return nil, toStatus(err)
	}
	return done, nil
}

// SweepHolds releases the holds of every registration this regnode
// granted whose record the fan-out's view no longer has under the lease
// granted, and returns how many. The regnode calls it periodically (see
// package node); without limits or a hub it does nothing.
func (s *Server) SweepHolds() int {
	if s.cfg.Limits == nil || s.cfg.Hub == nil {
		return 0
	}
	snap := s.cfg.Hub.Cache().Snapshot()
	return s.cfg.Limits.Sweep(snap.Revision(), func(i peerlimit.Instance) (int64, bool) {
		in, ok := snap.Get(i.Service, i.ID)
		if !ok {
			return 0, false
		}
		return in.LeaseId, true
	})
}
