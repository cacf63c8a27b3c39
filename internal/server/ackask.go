package server

import (
	"context"
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

// asker sends one stream's AckRequests from its own goroutine: whoever
// asks (a WaitApplied, a follower starting) never waits on the network.
// Requests not yet sent are coalesced per service (the highest revision).
type asker struct {
	mu   sync.Mutex
	want map[string]int64
	wake chan struct{}
	sent func() // counts each request sent
}

func newAsker(sent func()) *asker {
	return &asker{want: map[string]int64{}, wake: make(chan struct{}, 1), sent: sent}
}

// ask queues a request that service be acknowledged at rev.
func (a *asker) ask(service string, rev int64) {
	a.mu.Lock()
	if rev > a.want[service] {
		a.want[service] = rev
	}
	a.mu.Unlock()
	select {
	case a.wake <- struct{}{}:
	default:
	}
}

// run sends what is asked, on ms, until ctx ends or a send fails (the
// stream is then broken and its handler ends too).
func (a *asker) run(ctx context.Context, ms *muxStream) {
	for {
		select {
		case <-a.wake:
		case <-ctx.Done():
			return
		}
		a.mu.Lock()
		want := a.want
		a.want = map[string]int64{}
		a.mu.Unlock()
		for service, rev := range want {
			if err := ms.sendAckRequest(service, rev); err != nil {
				return
			}
			a.sent()
		}
	}
}

// sendAckRequest asks the client to acknowledge service at rev.
func (ms *muxStream) sendAckRequest(service string, rev int64) error {
	ms.sendMu.Lock()
	defer ms.sendMu.Unlock()
	return ms.send(&registryv1.SubscribeResponse{Service: service, AckRequest: &registryv1.AckRequest{Revision: rev}})
}
