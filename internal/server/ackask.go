package server

import (
	"sync"

	"google.golang.org/grpc/metadata"

	registryv1 "github.com/regcluster/registry/proto/registry/v1"
)

// Acknowledgements on request. A client that acknowledged every unit it
// applied sent the regnode one message per subscriber per change, read,
// decoded and entered in the table under its lock, to serve drains that
// are rare: with a thousand subscribers, each its own client, at twenty
// changes a second, that alone held the regnode to 14 changes delivered
// a second and a p99 of a second (regbench fanout; without acks 20/s and
// 112 ms). So a regnode asks: when a WaitApplied begins it sends each
// follower of the service that has not acknowledged its revision an
// AckRequest, and each follower that starts while a wait is in progress
// one too; the client acknowledges once it has applied that revision.
// The regnode says it asks in the stream's header (AckHeader), so a
// client of an older regnode, which never asks, acknowledges everything
// as before; an older client acknowledges everything anyway, which a
// regnode takes as it always did.

// AckHeader is the Subscribe stream's response header by which a regnode
// says it sends AckRequests, with the value AckRequested.
const (
	AckHeader    = "registry-acks"
	AckRequested = "requested"
)

// ackHeader is the header Subscribe sets.
func ackHeader() metadata.MD { return metadata.Pairs(AckHeader, AckRequested) }

// asker sends one stream's AckRequests: whoever asks (a WaitApplied, a
// follower starting) never waits on the network. Requests not yet sent
// are coalesced per service (the highest revision), and sent by a
// goroutine that runs only while there are some (asks are rare; a
// goroutine per stream for them would cost every subscriber its stack).
type asker struct {
	ms   *muxStream
	sent func() // counts each request sent

	mu      sync.Mutex
	want    map[string]int64
	running bool
	stopped bool
	wg      sync.WaitGroup
}

func newAsker(ms *muxStream, sent func()) *asker {
	return &asker{ms: ms, sent: sent, want: map[string]int64{}}
}

// ask queues a request that service be acknowledged at rev.
func (a *asker) ask(service string, rev int64) {
	a.mu.Lock()
	defer a.mu.Unlock()
	if a.stopped {
		return
	}
	if rev > a.want[service] {
		a.want[service] = rev
	}
	if !a.running {
		a.running = true
		a.wg.Add(1)
		go a.send()
	}
}

// send sends what is asked until nothing is, or a send fails (the stream
// is broken then, and its handler ends too).
func (a *asker) send() {
	defer a.wg.Done()
	for {
		a.mu.Lock()
		want := a.want
		if len(want) == 0 || a.stopped {
			a.running = false
			a.mu.Unlock()
			return
		}
		a.want = map[string]int64{}
		a.mu.Unlock()
		for service, rev := range want {
			if err := a.ms.sendAckRequest(service, rev); err != nil {
				a.mu.Lock()
				a.running, a.stopped = false, true
				a.mu.Unlock()
				return
			}
			a.sent()
		}
	}
}

// stop ends asking and waits for a send in progress (which the stream's
// end, if it must, unblocks).
func (a *asker) stop() {
	a.mu.Lock()
	a.stopped = true
	a.mu.Unlock()
	a.wg.Wait()
}

// sendAckRequest asks the client to acknowledge service at rev.
func (ms *muxStream) sendAckRequest(service string, rev int64) error {
	ms.sendMu.Lock()
	defer ms.sendMu.Unlock()
	return ms.send(&registryv1.SubscribeResponse{Service: service, AckRequest: &registryv1.AckRequest{Revision: rev}})
}
