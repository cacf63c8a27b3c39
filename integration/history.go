package integration

import (
	"context"
	"errors"
	"fmt"
	"maps"
	"math"
	"sort"
	"strings"
	"sync"
	"testing"
	"time"

	"go.etcd.io/etcd/api/v3/v3rpc/rpctypes"
	clientv3 "go.etcd.io/etcd/client/v3"
	"google.golang.org/protobuf/proto"

	"github.com/regcluster/registry/client"
	"github.com/regcluster/registry/internal/shard"
	registryv1 "github.com/regcluster/registry/proto/registry/v1"
	"github.com/regcluster/registry/record"
)

// Event is one change etcd recorded under the registry prefix.
type Event struct {
	Rev    int64
	Key    string
	Value  []byte
	Delete bool
	Create int64 // the key's create revision (puts)
	Lease  int64 // the lease the key was put under (puts)
}

// History records every change under the registry prefix from revision 1,
// by a watch that starts before the workload writes anything, so the
// checker can rebuild etcd's state at any revision even after compaction.
type History struct {
	keys   record.Keys
	cli    *clientv3.Client
	cancel context.CancelFunc
	done   chan struct{}

	mu     sync.Mutex
	events []Event
	rev    int64 // everything up to rev has been recorded
	err    error
}

// RecordHistory starts recording; it stops when the test ends.
func RecordHistory(t testing.TB, cli *clientv3.Client) *History {
	h := &History{keys: record.NewKeys(""), cli: cli, done: make(chan struct{})}
	ctx, cancel := context.WithCancel(context.Background())
	h.cancel = cancel
	watch := func(from int64) clientv3.WatchChan {
		return cli.Watch(clientv3.WithRequireLeader(ctx), h.keys.Prefix(), clientv3.WithPrefix(), clientv3.WithRev(from),
			clientv3.WithProgressNotify())
	}
	wch := watch(1)
	go func() {
		defer close(h.done)
		tick := time.NewTicker(100 * time.Millisecond)
		defer tick.Stop()
		for {
			select {
			case <-ctx.Done():
				return
			case <-tick.C:
				cli.RequestProgress(clientv3.WithRequireLeader(ctx))
			case resp, ok := <-wch:
				h.mu.Lock()
				var err error
				if ok {
					err = resp.Err()
				}
				if errors.Is(err, rpctypes.ErrCompacted) {
					h.err = fmt.Errorf("history watch: %w (compacted before it was recorded)", err)
				}
				if ok {
					for _, ev := range resp.Events {
						h.events = append(h.events, Event{Rev: ev.Kv.ModRevision, Key: string(ev.Kv.Key), Value: ev.Kv.Value,
							Delete: ev.Type == clientv3.EventTypeDelete, Create: ev.Kv.CreateRevision, Lease: ev.Kv.Lease})
						h.rev = max(h.rev, ev.Kv.ModRevision)
					}
					if resp.IsProgressNotify() {
						h.rev = max(h.rev, resp.Header.Revision)
					}
				}
				from := h.rev + 1
				h.mu.Unlock()
				if ctx.Err() != nil {
					return
				}
				if !ok || (err != nil && !errors.Is(err, rpctypes.ErrCompacted)) {
					// The member lost its leader (a member stopped) or the
					// stream ended: resume after what is recorded, so the
					// history stays whole.
					select {
					case <-ctx.Done():
						return
					case <-time.After(100 * time.Millisecond):
					}
					wch = watch(from)
				}
			}
		}
	}()
	t.Cleanup(func() { cancel(); <-h.done })
	return h
}

// WaitFor waits until the history holds everything up to rev.
func (h *History) WaitFor(t testing.TB, rev int64) {
	t.Helper()
	deadline := time.Now().Add(30 * time.Second)
	for {
		h.mu.Lock()
		got, err := h.rev, h.err
		h.mu.Unlock()
		if err != nil {
			t.Fatal(err)
		}
		if got >= rev {
			return
		}
		if time.Now().After(deadline) {
			t.Fatalf("history recorded up to %d, want %d", got, rev)
		}
		time.Sleep(20 * time.Millisecond)
	}
}

// Events returns a copy of the history so far and the revision it is
// complete up to.
func (h *History) Events() ([]Event, int64) {
	h.mu.Lock()
	defer h.mu.Unlock()
	return append([]Event(nil), h.events...), h.rev
}

// ViewInst is what a subscriber showed of one instance.
type ViewInst struct {
	ModRev    int64
	Lifecycle registryv1.Lifecycle
}

// View is one state a subscriber exposed.
type View struct {
	Rev      int64
	Reset    bool
	NewEpoch bool // a reset onto another etcd history (restored)
	// Stream counts the subscription's disconnections before it showed
	// this view: views of one stream share it. A subscription that
	// resumes on a new stream gets what it missed replayed as one change.
	Stream int
	Insts  map[string]ViewInst // by key
}

// Subscriber is an SDK subscription that records every view it exposes.
type Subscriber struct {
	Name string
	Sub  *client.Subscription
	keys record.Keys

	mu     sync.Mutex
	stream int // disconnections told so far (OnConnection)
	cur    map[string]ViewInst
	views  []View
	delay  time.Duration
}

// Follow subscribes to every service through c and records each view.
// delay makes it a slow reader: its callback sleeps that long per change.
func Follow(t testing.TB, c *client.Client, name string, delay time.Duration) *Subscriber {
	t.Helper()
	t.Helper()
	return FollowWith(t, c, name, delay, client.SubscribeOptions{})
}

// FollowWith is Follow with opts (its OnChange and OnConnection are the
// Subscriber's own).
func FollowWith(t testing.TB, c *client.Client, name string, delay time.Duration, opts client.SubscribeOptions) *Subscriber {
	t.Helper()
	s := &Subscriber{Name: name, keys: record.NewKeys(""), delay: delay}
	// The stream a view came on is counted from OnConnection, which the
	// SDK calls in order with OnChange (both behind the stream, on the
	// subscription's callback goroutine); the subscription's own
	// Stats().Reconnects, read in OnChange, may already count a later
	// stream than the change's.
	opts.OnChange, opts.OnConnection = s.record, s.connection
	sub, err := c.Subscribe(context.Background(), "", opts)
	if err != nil {
		t.Fatal(err)
	}
	s.mu.Lock()
	s.Sub = sub
	s.mu.Unlock()
	t.Cleanup(sub.Close)
	return s
}

// record folds one change into the view this subscriber exposes (a
// snapshot replaces it; a diff updates it) and keeps a copy. Folding the
// changes, rather than reading the subscription's cache, also checks that
// the diffs the SDK hands out add up to its views.
func (s *Subscriber) record(ch client.Change) {
	if ch.Progress {
		return
	}
	s.mu.Lock()
	stream := s.stream
	if ch.Snapshot {
		s.cur = map[string]ViewInst{}
		for _, in := range ch.Instances {
			s.cur[s.keys.Instance(in.Service, in.Id)] = ViewInst{ModRev: in.ModRevision, Lifecycle: in.Lifecycle}
		}
	} else {
		for _, in := range append(append([]*registryv1.Instance(nil), ch.Added...), ch.Updated...) {
			s.cur[s.keys.Instance(in.Service, in.Id)] = ViewInst{ModRev: in.ModRevision, Lifecycle: in.Lifecycle}
		}
		for _, k := range ch.Removed {
			delete(s.cur, s.keys.Instance(k.Service, k.ID))
		}
	}
	s.views = append(s.views, View{Rev: ch.Revision, Reset: ch.Snapshot, NewEpoch: ch.NewEpoch, Stream: stream, Insts: maps.Clone(s.cur)})
	s.mu.Unlock()
	if s.delay > 0 {
		time.Sleep(s.delay)
	}
}

// connection counts the subscription's disconnections.
func (s *Subscriber) connection(f client.Freshness) {
	if f.Connected {
		return
	}
	s.mu.Lock()
	s.stream++
	s.mu.Unlock()
}

// Views returns the views recorded so far.
func (s *Subscriber) Views() []View {
	s.mu.Lock()
	defer s.mu.Unlock()
	return append([]View(nil), s.views...)
}

// Report is what the checker found.
type Report struct {
	Views, Events, Deletes, DrainChecks, HealthWrites int
	// Calls counts the served calls judged by CheckCalls; OutOfRotation
	// those among them whose backend left rotation (no routable instance)
	// at some revision of their window: the calls a lagging resolver
	// would have misrouted.
	Calls, OutOfRotation int
	Violations           []string
}

func (r *Report) fail(format string, args ...any) {
	if len(r.Violations) < 20 {
		r.Violations = append(r.Violations, fmt.Sprintf(format, args...))
	}
}

// Check verifies every invariant the suite can see: each recorded view
// equals etcd's state at its revision (no phantom, no lost delete, resets
// included), each subscriber's revision never decreases, a gracefully
// deregistered instance was DRAINING in every subscriber that followed it
// incrementally across its drain, every health write is its owner's,
// under the membership of its time, and every registration still open is in etcd.
//
// Views newer than upTo (the revision the history is complete up to) are
// not judged: the prober keeps writing while the checker runs.
//
// open are the registrations still open, each of which etcd must hold at
// revision openAt (0: at the end of events). A finish that saw them all
// held at one revision passes that revision: a lease revoked later (etcd's
// own old leader can revoke leases it thinks expired when it resumes from
// a pause, etcd-io/etcd#15247) is brought back by its keeper, but maybe
// only after the history's end.
func Check(events []Event, upTo int64, subs []*Subscriber, open []string, openAt int64) Report {
	keys := record.NewKeys("")
	var rep Report
	rep.Events = len(events)
	sort.SliceStable(events, func(i, j int) bool { return events[i].Rev < events[j].Rev })
	decode := func(ev Event) *registryv1.Instance {
		if ev.Delete {
			return nil
		}
		in, err := keys.Decode(ev.Key, ev.Value, ev.Create, ev.Rev)
		if err != nil {
			return nil // junk: readers treat it as absent
		}
		return in
	}
	isInstance := func(key string) bool { _, _, ok := keys.Parse(key); return ok }

	// Views against etcd's state at their revision.
	for _, s := range subs {
		views := s.Views()
		state := map[string]*registryv1.Instance{}
		i := 0
		var last int64
		for _, v := range views {
			if v.Rev > upTo {
				break
			}
			if v.Rev < last {
				rep.fail("subscriber %s: revision went down from %d to %d", s.Name, last, v.Rev)
			}
			last = v.Rev
			rep.Views++
			for ; i < len(events) && events[i].Rev <= v.Rev; i++ {
				if ev := events[i]; isInstance(ev.Key) {
					if in := decode(ev); in != nil {
						state[ev.Key] = in
					} else {
						delete(state, ev.Key)
					}
				}
			}
			for key, in := range state {
				got, ok := v.Insts[key]
				switch {
				case !ok:
					rep.fail("subscriber %s at revision %d: %s missing (etcd holds it, mod %d): a lost put", s.Name, v.Rev, key, in.ModRevision)
				case got.ModRev != in.ModRevision:
					rep.fail("subscriber %s at revision %d: %s at mod %d, etcd at mod %d", s.Name, v.Rev, key, got.ModRev, in.ModRevision)
				}
			}
			for key := range v.Insts {
				if _, ok := state[key]; !ok {
					rep.fail("subscriber %s at revision %d: %s shown but absent from etcd: a phantom or a lost delete", s.Name, v.Rev, key)
				}
			}
		}
	}

	// Drain before delete, and fences.
	type drain struct{ from int64 }
	draining := map[string]*drain{}
	// The membership: live announcements (address -> name, lease, mod
	// revision). A health write under fence F by regnode N at revision W
	// is the owner's (shard.View.Guard): N's announcement is live, no
	// announcement was written after F, and N owns the instance by
	// rendezvous over the live announcements.
	type announced struct {
		name  string
		lease int64
		mod   int64
	}
	nodes := map[string]announced{}
	nodesPrefix := keys.Prefix() + "nodes/"
	owner := func(service, id string) (string, int64) {
		v := shard.View{Self: -1}
		var newest int64
		for addr, a := range nodes {
			if a.lease != 0 {
				v.Members = append(v.Members, shard.Member{Key: addr, Name: a.name, Lease: a.lease})
			}
			newest = max(newest, a.mod)
		}
		m, _ := v.Owner(service, id)
		return m.Name, newest
	}
	lastHealth := map[string]*registryv1.Health{}
	for _, ev := range events {
		if !isInstance(ev.Key) {
			addr, ok := strings.CutPrefix(ev.Key, nodesPrefix)
			if !ok {
				continue // not an announcement (the election, the epoch key, junk)
			}
			if ev.Delete {
				delete(nodes, addr)
			} else {
				nodes[addr] = announced{name: shard.Decode(ev.Value).Name, lease: ev.Lease, mod: ev.Rev}
			}
			continue
		}
		in := decode(ev)
		switch {
		case in == nil:
			if d := draining[ev.Key]; d != nil && ev.Delete {
				rep.Deletes++
				for _, s := range subs {
					rep.DrainChecks += checkDrained(&rep, s, ev.Key, d.from, ev.Rev)
				}
			}
			delete(draining, ev.Key)
		case in.Lifecycle == registryv1.Lifecycle_LIFECYCLE_DRAINING:
			if draining[ev.Key] == nil {
				draining[ev.Key] = &drain{from: ev.Rev}
			}
		default:
			delete(draining, ev.Key)
		}
		// Only a put that changed the health is a prober's write; other
		// writers (drains) carry the health they read, and a registration
		// (the put that creates the key) carries the health saved from
		// before a lost lease: the prober only ever updates a key.
		prev := lastHealth[ev.Key]
		if in == nil {
			delete(lastHealth, ev.Key)
		} else {
			lastHealth[ev.Key] = in.Health
		}
		if in != nil && ev.Rev != ev.Create && in.Health != nil && in.Health.Fence != 0 && !proto.Equal(prev, in.Health) {
			rep.HealthWrites++
			if o, newest := owner(in.Service, in.Id); o != in.Health.Observer || newest > in.Health.Fence {
				rep.fail("revision %d: %s health %v written by %s under fence %d, but its owner then was %q, by the membership of revision %d",
					ev.Rev, ev.Key, in.Health.State, in.Health.Observer, in.Health.Fence, o, newest)
			}
		}
	}

	// Every registration still open is in etcd at the end.
	final := map[string]bool{}
	for _, ev := range events {
		if openAt > 0 && ev.Rev > openAt {
			break // sorted by revision
		}
		if isInstance(ev.Key) {
			final[ev.Key] = decode(ev) != nil
		}
	}
	for _, key := range open {
		if !final[key] {
			at := "the end"
			if openAt > 0 {
				at = fmt.Sprintf("revision %d", openAt)
			}
			rep.fail("%s: its registration is open but etcd does not hold it at %s (lease lost and not registered again?); its events: %s", key, at, trail(events, key))
		}
	}
	return rep
}

// checkDrained: if s followed key incrementally from before its drain
// (revision drainRev) to its delete (deleteRev), one of its views in
// between must show it DRAINING. Returns 1 if the check applied.
func checkDrained(rep *Report, s *Subscriber, key string, drainRev, deleteRev int64) int {
	return checkDrainedViews(rep, s.Name, s.Views(), key, drainRev, deleteRev)
}

func checkDrainedViews(rep *Report, name string, views []View, key string, drainRev, deleteRev int64) int {
	before, after := -1, -1
	for i, v := range views {
		if v.Rev < drainRev {
			before = i
		}
		if v.Rev >= deleteRev && after < 0 {
			after = i
		}
	}
	if before < 0 || after < 0 {
		return 0 // not following across it
	}
	if _, ok := views[before].Insts[key]; !ok {
		return 0 // did not show it before the drain
	}
	for _, v := range views[before+1 : after+1] {
		if v.Reset {
			return 0 // a reset may legitimately skip the drain
		}
	}
	if after == before+1 && views[after].Stream != views[before].Stream {
		// Away across the whole drain (a cut, a killed regnode, or a
		// reconnect slower than the drain grace, as on a loaded machine):
		// the replay of what it missed is one change. Not following.
		return 0
	}
	for _, v := range views[before+1 : after] {
		if vi, ok := v.Insts[key]; ok && vi.Lifecycle == registryv1.Lifecycle_LIFECYCLE_DRAINING {
			return 1
		}
	}
	rep.fail("subscriber %s: %s deleted at revision %d after draining at %d, but never shown DRAINING", name, key, deleteRev, drainRev)
	return 1
}

// routability is, per address, the revisions at which some instance with
// that address was callable (see callable), as closed intervals; an open
// one ends at math.MaxInt64.
type routability map[string][][2]int64

func routableIntervals(events []Event) routability {
	keys := record.NewKeys("")
	out := routability{}
	state := map[string]*registryv1.Instance{}
	count := map[string]int{} // routable instances per address
	for i := 0; i < len(events); {
		rev := events[i].Rev
		touched := map[string]bool{}
		before := map[string]int{}
		for ; i < len(events) && events[i].Rev == rev; i++ {
			ev := events[i]
			if _, _, ok := keys.Parse(ev.Key); !ok {
				continue
			}
			var in *registryv1.Instance
			if !ev.Delete {
				in, _ = keys.Decode(ev.Key, ev.Value, ev.Create, ev.Rev) // junk: absent
			}
			for _, x := range []*registryv1.Instance{state[ev.Key], in} {
				if x != nil && !touched[x.Address] {
					touched[x.Address], before[x.Address] = true, count[x.Address]
				}
			}
			if old := state[ev.Key]; old != nil && callable(old) {
				count[old.Address]--
			}
			if in != nil && callable(in) {
				count[in.Address]++
			}
			if in != nil {
				state[ev.Key] = in
			} else {
				delete(state, ev.Key)
			}
		}
		for addr := range touched {
			was, is := before[addr] > 0, count[addr] > 0
			switch {
			case !was && is:
				out[addr] = append(out[addr], [2]int64{rev, math.MaxInt64})
			case was && !is:
				iv := out[addr]
				iv[len(iv)-1][1] = rev - 1
			}
		}
	}
	return out
}

// callable is whether the SDK's balancer may send in a new call: it is
// SERVING. Routable (healthy) instances get the calls, but in panic mode
// (too few routable) the balancer spreads calls over every SERVING
// instance, sick ones included, by design; a DRAINING, STARTING or deleted
// instance never gets one.
func callable(in *registryv1.Instance) bool {
	return in.GetLifecycle() == registryv1.Lifecycle_LIFECYCLE_SERVING
}

// routableDuring is true if some instance at addr was routable at some
// revision in [lo, hi].
func (r routability) routableDuring(addr string, lo, hi int64) bool {
	for _, iv := range r[addr] {
		if iv[0] <= hi && iv[1] >= lo {
			return true
		}
	}
	return false
}

// CheckCalls judges the calls of the workload's callers (see callers.go
// for why it is sound without clocks): a call served by a backend whose
// address no instance made routable at any revision of the call's window
// reached an instance that every view the caller could have routed it by
// had out of rotation (DRAINING, STARTING or deleted): a violation.
// Calls whose window reaches past upTo are not judged.
func CheckCalls(rep *Report, events []Event, upTo int64, calls []Call, served []Served) {
	sort.SliceStable(events, func(i, j int) bool { return events[i].Rev < events[j].Rev })
	routable := routableIntervals(events)
	byID := make(map[string]Call, len(calls))
	for _, c := range calls {
		byID[c.ID] = c
	}
	for _, sv := range served {
		c, ok := byID[sv.ID]
		if !ok {
			rep.fail("call %s served by %s but never made by a caller", sv.ID, sv.Addr)
			continue
		}
		if c.After > upTo {
			continue
		}
		rep.Calls++
		if !routable.routableDuring(sv.Addr, c.Before, c.After) {
			rep.fail("call %s reached %s, which was out of rotation at every revision from %d to %d (the views its caller could route by)",
				sv.ID, sv.Addr, c.Before, c.After)
			continue
		}
		if routable.routableDuring(sv.Addr, c.Before, c.After) && !allRoutable(routable[sv.Addr], c.Before, c.After) {
			rep.OutOfRotation++
		}
	}
}

// allRoutable is true if ivs cover every revision of [lo, hi].
func allRoutable(ivs [][2]int64, lo, hi int64) bool {
	for _, iv := range ivs {
		if iv[0] <= lo && iv[1] >= hi {
			return true
		}
	}
	return false
}

// trail is key's events, oldest first, as "rev:put@lease" and "rev:delete",
// so a violation says how the key got where it is.
func trail(events []Event, key string) string {
	var b strings.Builder
	for _, ev := range events {
		if ev.Key != key {
			continue
		}
		if b.Len() > 0 {
			b.WriteString(" ")
		}
		if ev.Delete {
			fmt.Fprintf(&b, "%d:delete", ev.Rev)
		} else {
			fmt.Fprintf(&b, "%d:put@%x", ev.Rev, ev.Lease)
		}
	}
	if b.Len() == 0 {
		return "none"
	}
	return b.String()
}
