package client

import (
	"time"

	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/connectivity"
	"google.golang.org/grpc/status"
)

// The first view of a registry:/// channel. Until its service's first
// view arrives (live, or from the disk cache) the resolver pushes a state
// that says "not known yet" (balance.Service with Known false), which
// package balance turns into CONNECTING: calls queue, fail-fast or not,
// as they do behind any gRPC resolver that has not produced its first
// result. Only once the Client's connect timeout has passed with no
// regnode answering does the state say "unreached", which is
// TRANSIENT_FAILURE: fail-fast calls fail at once with "registry not
// reached yet and no cached list", wait-for-ready calls keep waiting
// until their deadline. A regnode that answers but refuses the service
// (a token without read access) fails calls at once with its reason:
// waiting would not change it. A view once known is never replaced by
// any of these: it keeps serving.

// DefaultConnectTimeout is Config.ConnectTimeout's default: how long a
// channel whose first view has not come waits for a regnode to answer.
const DefaultConnectTimeout = 2 * time.Second

// connectBackoff is the regnode connections' reconnect backoff (grpc's
// own starts at 1s): a regnode that refused the first connection (not up
// yet, or restarting) is tried several times within DefaultConnectTimeout
// rather than once. MaxDelay bounds the wait at 5s (grpc's: 120s) so a
// regnode back after a long outage is found within seconds; a regnode
// that is down costs a refused connection per attempt.
var connectBackoff = struct {
	base, max  time.Duration
	multiplier float64
	jitter     float64
}{base: 200 * time.Millisecond, max: 5 * time.Second, multiplier: 1.6, jitter: 0.2}

// minConnectTimeout is grpc's own default: how long one connection
// attempt may take (the connect timeout above is about the first view,
// not one attempt).
const minConnectTimeout = 20 * time.Second

// firstViewCheck is how often a resolver still waiting for its first
// view looks again at whether the registry was reached or refused.
const firstViewCheck = 50 * time.Millisecond

// waitState is what a channel says before its service's first view.
type waitState struct {
	unreached bool   // the connect timeout passed with no regnode answering
	refused   string // a regnode refused the service: why
}

// waitingAt judges, at now, the resolver's subscription, which has no
// view yet. Its connect timeout runs from when the subscription started
// (a resolver built on a subscription that has waited that long already
// is judged at once).
func (r *regResolver) waitingAt(now time.Time) waitState {
	f := r.sub.Freshness()
	if f.Err != nil && refusal(f.Err) {
		return waitState{refused: status.Convert(f.Err).Message()}
	}
	c := r.sub.c
	if now.Sub(r.sub.started) < c.connectTimeout {
		return waitState{}
	}
	if f.Connected || c.cc.GetState() == connectivity.Ready {
		return waitState{} // a regnode answers: the view is on its way
	}
	return waitState{unreached: true}
}

// refusal reports whether err is a regnode's answer that retrying will
// not change (unlike a connection that failed or a regnode that stops).
func refusal(err error) bool {
	switch status.Code(err) {
	case codes.PermissionDenied, codes.Unauthenticated, codes.InvalidArgument:
		return true
	}
	return false
}

// offerWaiting offers the "not known yet" view for w, unless it is what
// was offered last. Called by one goroutine at a time: Build before run
// starts, then run.
func (r *regResolver) offerWaiting(w waitState) {
	if r.waitedOnce && w == r.lastWait {
		return
	}
	r.waitedOnce, r.lastWait = true, w
	r.stage++
	v := r.view(0, nil, w)
	v.stage = r.stage
	r.offer(v)
}
