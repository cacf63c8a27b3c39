package node

import (
	"context"
	"fmt"
	"time"

	"github.com/regcluster/registry/internal/server"
	"github.com/regcluster/registry/internal/stopper"
)

// holdSweepEvery is how often the registrations each key holds are
// compared with the fan-out's view: a registration that ended without
// passing through this regnode (expired, revoked, deregistered through
// another regnode) frees its slot within about this long after the view
// sees it end.
const holdSweepEvery = time.Second

// defaultAPILimits fills the API's message and stream limits left zero.
func (c *Config) defaultAPILimits() {
	if c.MaxConcurrentStreams == 0 {
		c.MaxConcurrentStreams = DefaultMaxConcurrentStreams
	}
	if c.MaxRequestBytes == 0 {
		c.MaxRequestBytes = DefaultMaxRequestBytes
	}
	if c.MaxResponseBytes == 0 {
		c.MaxResponseBytes = DefaultMaxResponseBytes
	}
}

// validateAPILimits refuses message caps below what a working registry
// sends: a Register of a record at its size cap, a List page or a Watch
// chunk (0 means the default).
func (c *Config) validateAPILimits() error {
	if c.MaxRequestBytes != 0 && c.MaxRequestBytes < MinRequestBytes {
		return invalid("MaxRequestBytes", c.MaxRequestBytes,
			fmt.Sprintf("must be at least %d, twice the largest record (0: the default)", MinRequestBytes))
	}
	if c.MaxResponseBytes != 0 && c.MaxResponseBytes < MinResponseBytes {
		return invalid("MaxResponseBytes", c.MaxResponseBytes,
			fmt.Sprintf("must be at least %d, twice a List page or Watch chunk (0: the default)", MinResponseBytes))
	}
	return nil
}

// sweepHolds releases, every holdSweepEvery until Close, the registration
// slots of registrations that ended without this regnode seeing the call
// that ended them (see server.SweepHolds).
func (n *Node) sweepHolds(ctx context.Context, api *server.Server) error {
	return n.life.Start(ctx, stopper.Component{Name: "registration sweeper",
		Run: func(ctx context.Context) error {
			t := time.NewTicker(holdSweepEvery)
			defer t.Stop()
			for {
				select {
				case <-ctx.Done():
					return nil
				case <-t.C:
					api.SweepHolds()
				}
			}
		}})
}
