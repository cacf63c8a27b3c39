package client

import (
	"errors"
	"fmt"

	"google.golang.org/genproto/googleapis/rpc/errdetails"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	"github.com/regcluster/registry/cache"
	registryv1 "github.com/regcluster/registry/proto/registry/v1"
)

// The ErrorInfo reasons of regnode's statuses that the SDK branches on
// (the server package documents them; a test keeps the two equal).
const (
	errorDomain            = "registry.regcluster.io"
	reasonRevisionAhead    = "REVISION_AHEAD"
	reasonPageTokenExpired = "PAGE_TOKEN_EXPIRED"
)

// reason is the ErrorInfo reason of a regnode status ("" if none).
func reason(err error) string {
	st, ok := status.FromError(err)
	if !ok || st.Code() == codes.OK {
		return ""
	}
	for _, d := range st.Details() {
		if info, ok := d.(*errdetails.ErrorInfo); ok && info.Domain == errorDomain {
			return info.Reason
		}
	}
	return ""
}

// errOtherEpoch: a regnode sent, on another epoch than the view's,
// something other than a new-epoch reset; the stream is dropped.
var errOtherEpoch = errors.New("regnode answered on another epoch without a new-epoch reset")

// toBatch converts one whole Watch unit (chunks joined) to a cache batch;
// ok is false for a kind this SDK does not know.
func toBatch(r *registryv1.WatchResponse) (b cache.Batch, ok bool) {
	switch k := r.Kind.(type) {
	case *registryv1.WatchResponse_Snapshot:
		return cache.Batch{Revision: r.Revision, Snapshot: true, Reset: k.Snapshot.Reset_, NewEpoch: k.Snapshot.NewEpoch,
			Epoch: r.Epoch, Instances: k.Snapshot.Instances}, true
	case *registryv1.WatchResponse_Events:
		b = cache.Batch{Revision: r.Revision, Events: make([]cache.Event, 0, len(k.Events.Events))}
		for _, e := range k.Events.Events {
			if e.Type == registryv1.Event_TYPE_PUT {
				if e.Instance == nil {
					continue
				}
				b.Events = append(b.Events, cache.Event{Type: cache.Put, Service: e.Instance.Service, ID: e.Instance.Id, Instance: e.Instance})
			} else {
				b.Events = append(b.Events, cache.Event{Type: cache.Delete, Service: e.Service, ID: e.Id})
			}
		}
		return b, true
	case *registryv1.WatchResponse_Progress:
		return cache.Batch{Revision: r.Revision}, true
	}
	return cache.Batch{}, false
}

// Epoch is the etcd history the view belongs to ("" until a regnode that
// tracks epochs has answered). It changes only with a NewEpoch change.
func (s *Subscription) Epoch() string {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.mu.epoch
}

// checkEpoch decides whether a unit of epoch ep may be applied to the
// view; a snapshot that starts a new epoch always may.
func (s *Subscription) checkEpoch(ep string, b cache.Batch) error {
	mine := s.Epoch()
	if ep == "" || mine == "" || ep == mine || b.Snapshot && b.NewEpoch {
		return nil
	}
	return fmt.Errorf("%w: view on %q, revision %d of %q", errOtherEpoch, mine, b.Revision, ep)
}

// setEpoch records the epoch of an applied unit.
func (s *Subscription) setEpoch(ep string) {
	if ep == "" {
		return
	}
	s.mu.Lock()
	s.mu.epoch = ep
	s.mu.ahead = 0
	s.mu.Unlock()
}

// noteAhead counts a regnode's REVISION_AHEAD answer. Once as many
// answers in a row as the client has endpoints (at least two) say so
// (round robin sends each attempt to the next regnode that is up), none
// has the view's revision: the next stream subscribes afresh, and its
// snapshot replaces the view as a new epoch even if its revision is lower.
func (s *Subscription) noteAhead(err error) {
	if reason(err) != reasonRevisionAhead {
		return
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	s.mu.ahead++
	if s.mu.ahead >= max(s.c.endpoints, 2) {
		s.mu.ahead, s.mu.afresh = 0, true
		s.c.log.Warn("no regnode has this subscription's revision; subscribing afresh",
			"service", s.service, "revision", s.cache.Revision(), "epoch", s.mu.epoch, "err", err)
	}
}

// keepFresh makes the next stream subscribe afresh again if still is
// true (the fresh stream ended before its snapshot).
func (s *Subscription) keepFresh(still bool) {
	if !still {
		return
	}
	s.mu.Lock()
	s.mu.afresh = true
	s.mu.Unlock()
}

// takeFresh reports (once) that the next stream must subscribe afresh.
func (s *Subscription) takeFresh() bool {
	s.mu.Lock()
	defer s.mu.Unlock()
	f := s.mu.afresh
	s.mu.afresh = false
	return f
}
