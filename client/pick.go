package client

import (
	"context"
	"math/rand/v2"
	"sync"
	"sync/atomic"

	"google.golang.org/grpc/balancer"
	"google.golang.org/grpc/balancer/base"
)

// regnodePolicy is the balancing policy of a Client's connection to its
// regnodes: round robin over the ready ones, except that a call can ask to
// avoid one regnode (the one whose stream just stalled) and learn which
// one it went to. Round robin alone sends a resuming subscription back to
// the paused regnode whenever other calls advanced its counter in between
// (several subscriptions resuming at once, from one Client, always do).
const regnodePolicy = "registry_regnodes"

func init() {
	balancer.Register(base.NewBalancerBuilder(regnodePolicy, regnodePicker{}, base.Config{}))
}

// pickNote rides in a call's context: the regnode to avoid (in), and the
// one the call went to (out).
type pickNote struct {
	avoid  string
	mu     sync.Mutex
	picked string
}

type pickNoteKey struct{}

// withPickNote returns ctx carrying n.
func withPickNote(ctx context.Context, n *pickNote) context.Context {
	return context.WithValue(ctx, pickNoteKey{}, n)
}

// Picked is the address of the regnode the call went to ("" if none yet).
func (n *pickNote) Picked() string {
	n.mu.Lock()
	defer n.mu.Unlock()
	return n.picked
}

type regnodePicker struct{}

// Build makes an immutable picker of the ready regnodes.
func (regnodePicker) Build(info base.PickerBuildInfo) balancer.Picker {
	if len(info.ReadySCs) == 0 {
		return base.NewErrPicker(balancer.ErrNoSubConnAvailable)
	}
	p := &avoidingPicker{}
	for sc, sci := range info.ReadySCs {
		p.scs = append(p.scs, sc)
		p.addrs = append(p.addrs, sci.Address.Addr)
	}
	p.next.Store(rand.Uint32()) // so that new connections do not all start on the first
	return p
}

type avoidingPicker struct {
	scs   []balancer.SubConn
	addrs []string
	next  atomic.Uint32
}

// Pick goes round robin, skipping the regnode the call asks to avoid if
// another is ready.
func (p *avoidingPicker) Pick(info balancer.PickInfo) (balancer.PickResult, error) {
	note, _ := info.Ctx.Value(pickNoteKey{}).(*pickNote)
	n := uint32(len(p.scs))
	i := p.next.Add(1) % n
	if note != nil && n > 1 && p.addrs[i] == note.avoid {
		i = (i + 1 + rand.Uint32N(n-1)) % n // any other
	}
	if note != nil {
		note.mu.Lock()
		note.picked = p.addrs[i]
		note.mu.Unlock()
	}
	return balancer.PickResult{SubConn: p.scs[i]}, nil
}
