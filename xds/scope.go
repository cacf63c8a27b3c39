package xds

import (
	"context"
	"sync"

	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
)

// Scope. With Config.Scope set (regnode --auth), each stream is served
// only the services its client may read: the names it asks for are cut
// to those before the caches see them, so the others are absent (a gRPC
// client reports them as not existing), never revealed. A client that
// may not read every service must name what it wants: a wildcard
// subscription (Envoy's usual listeners and clusters) is refused with
// PermissionDenied, since it would be served every service.

// denied stands for "nothing" in a subscription whose every name was cut:
// an empty list would read as a wildcard. It is no valid service name, so
// no resource ever has it.
const denied = "-"

// scope is what one stream may read.
type scope struct {
	all     bool
	canRead func(service string) bool
}

// scopes are the streams' scopes, by stream id.
type scopes struct {
	of func(ctx context.Context) (all bool, canRead func(string) bool) // Config.Scope; nil: all

	mu sync.Mutex
	m  map[int64]scope
}

func (s *scopes) open(ctx context.Context, id int64) {
	if s.of == nil {
		return
	}
	all, canRead := s.of(ctx)
	s.mu.Lock()
	defer s.mu.Unlock()
	s.m[id] = scope{all: all, canRead: canRead}
}

func (s *scopes) close(id int64) {
	s.mu.Lock()
	defer s.mu.Unlock()
	delete(s.m, id)
}

// cut returns names as stream id may ask for them: all of them for a
// client that may read everything; else those it may read (denied if
// none), or PermissionDenied for a wildcard.
func (s *scopes) cut(id int64, typeURL string, names []string, wildcard bool) ([]string, error) {
	if s.of == nil {
		return names, nil
	}
	s.mu.Lock()
	sc, ok := s.m[id]
	s.mu.Unlock()
	if ok && sc.all {
		return names, nil
	}
	if wildcard {
		return nil, status.Errorf(codes.PermissionDenied,
			"xDS: this token may read only some services: name the resources of type %s (a wildcard subscription would serve every service)", typeURL)
	}
	kept := names[:0:0]
	for _, n := range names {
		if n == "*" {
			return nil, status.Errorf(codes.PermissionDenied,
				"xDS: this token may read only some services: name the resources of type %s (not a wildcard \"*\")", typeURL)
		}
		if ok && sc.canRead(n) {
			kept = append(kept, n)
		}
	}
	if len(kept) == 0 && len(names) > 0 {
		kept = []string{denied}
	}
	return kept, nil
}
