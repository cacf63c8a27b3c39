package dnsapi

import (
	"math"
	"net/netip"
	"sync"
	"time"

	"golang.org/x/time/rate"
)

// sources holds a token bucket per source address, in at most max
// entries: two generations of at most max/2 each. A source is looked up in
// the current generation, then in the previous one (and moved up); when the
// current one is full, it becomes the previous one and the previous one is
// forgotten. So a source seen within the last max/2 distinct sources keeps
// its bucket, and a flood of spoofed addresses costs bounded memory: it
// only makes the forgotten sources start again with a full burst.
type sources struct {
	limit rate.Limit
	burst int
	half  int

	mu       sync.Mutex
	cur, old map[netip.Addr]*rate.Limiter
}

func newSources(r float64, burst, max int) *sources {
	if burst == 0 {
		burst = int(math.Min(math.Ceil(r), math.MaxInt32))
	}
	half := max / 2
	return &sources{limit: rate.Limit(r), burst: burst, half: half, cur: make(map[netip.Addr]*rate.Limiter)}
}

// allow reports whether src may make a query at now, and takes its token.
func (s *sources) allow(src netip.Addr, now time.Time) bool {
	s.mu.Lock()
	l := s.cur[src]
	if l == nil {
		if l = s.old[src]; l == nil {
			l = rate.NewLimiter(s.limit, s.burst)
		}
		if len(s.cur) >= s.half {
			s.old, s.cur = s.cur, make(map[netip.Addr]*rate.Limiter, s.half)
		}
		s.cur[src] = l
	}
	s.mu.Unlock()
	return l.AllowN(now, 1)
}

// len is the number of sources tracked (for tests).
func (s *sources) len() int {
	s.mu.Lock()
	defer s.mu.Unlock()
	return len(s.cur) + len(s.old)
}
