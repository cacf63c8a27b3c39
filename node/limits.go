package node

import (
	"time"

	"github.com/regcluster/registry/server"
)

// holdSweepEvery is how often the registrations each key holds are
// compared with the fan-out's view: a registration that ended without
// passing through this regnode (expired, revoked, deregistered through
// another regnode) frees its slot within about this long after the view
// sees it end.
const holdSweepEvery = time.Second

// sweepHolds releases, every holdSweepEvery until Close, the registration
// slots of registrations that ended without this regnode seeing the call
// that ended them (see server.SweepHolds).
func (n *Node) sweepHolds(api *server.Server) {
	n.wg.Add(1)
	go func() {
		defer n.wg.Done()
		t := time.NewTicker(holdSweepEvery)
		defer t.Stop()
		for {
			select {
			case <-n.done:
				return
			case <-t.C:
				api.SweepHolds()
			}
		}
	}()
}
