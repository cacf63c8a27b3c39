package xds

import (
	"testing"

	endpointv3 "github.com/envoyproxy/go-control-plane/envoy/config/endpoint/v3"
	listenerv3 "github.com/envoyproxy/go-control-plane/envoy/config/listener/v3"
	"github.com/envoyproxy/go-control-plane/pkg/cache/types"
	resourcev3 "github.com/envoyproxy/go-control-plane/pkg/resource/v3"
)

// answered is what a stream of sub would be sent now, as resource names
// (nil: nothing due); sub then has them.
func answered(t *testing.T, tb *table, sub *sotwSub, force bool) []string {
	t.Helper()
	res, version, ok := tb.answer(sub, force)
	if version != tb.version {
		t.Fatalf("answer's version %q, table's %q", version, tb.version)
	}
	if !ok {
		return nil
	}
	names := []string{}
	for _, a := range res {
		switch a.TypeUrl {
		case resourcev3.EndpointType:
			var cla endpointv3.ClusterLoadAssignment
			if err := a.UnmarshalTo(&cla); err != nil {
				t.Fatal(err)
			}
			names = append(names, cla.ClusterName)
		case resourcev3.ListenerType:
			var l listenerv3.Listener
			if err := a.UnmarshalTo(&l); err != nil {
				t.Fatal(err)
			}
			names = append(names, l.Name)
		}
	}
	return names
}

func same(a, b []string) bool {
	if len(a) != len(b) {
		return false
	}
	m := map[string]bool{}
	for _, x := range a {
		m[x] = true
	}
	for _, x := range b {
		if !m[x] {
			return false
		}
	}
	return true
}

// A stream of assignments is sent those it follows that changed since it
// last got them, nothing when none did (even if others did, or one it
// follows went: state of the world cannot say so for EDS), and an answer
// even if empty when it knows no version.
func TestTableAssignments(t *testing.T) {
	tb := newTable(resourcev3.EndpointType, "p-0")
	cla := func(s string) types.Resource { return &endpointv3.ClusterLoadAssignment{ClusterName: s} }
	st := &sotwStream{wake: make(chan struct{}, 1)}
	sub := &sotwSub{st: st, t: tb, sent: map[string]string{}}
	sub.resubscribe([]string{"a", "unknown"})
	if got := answered(t, tb, sub, true); got == nil || len(got) != 0 {
		t.Fatalf("first answer of an empty table: %v, want an empty response", got)
	}
	if err := tb.update("p-1", map[string]types.Resource{"a": cla("a"), "b": cla("b")}, nil); err != nil {
		t.Fatal(err)
	}
	select {
	case <-st.wake:
	default:
		t.Fatal("a change of a followed resource woke no sender")
	}
	if got := answered(t, tb, sub, false); !same(got, []string{"a"}) {
		t.Fatalf("after a's change: %v, want [a]", got)
	}
	if got := answered(t, tb, sub, false); got != nil {
		t.Fatalf("nothing changed: %v, want nothing due", got)
	}
	if err := tb.update("p-2", map[string]types.Resource{"b": cla("b")}, nil); err != nil {
		t.Fatal(err)
	}
	select {
	case <-st.wake:
		t.Fatal("a change of another resource woke the sender")
	default:
	}
	if got := answered(t, tb, sub, false); got != nil {
		t.Fatalf("b changed: %v, want nothing due", got)
	}
	if err := tb.update("p-3", map[string]types.Resource{"unknown": cla("unknown")}, []string{"a"}); err != nil {
		t.Fatal(err)
	}
	if got := answered(t, tb, sub, false); !same(got, []string{"unknown"}) {
		t.Fatalf("unknown made, a gone: %v, want [unknown]", got)
	}
	if _, ok := sub.sent["a"]; ok {
		t.Fatal("a gone is still counted as sent")
	}
	sub.resubscribe([]string{"unknown", "b"})
	if got := answered(t, tb, sub, false); !same(got, []string{"b"}) {
		t.Fatalf("b followed: %v, want [b]", got)
	}
}

// Listeners go as a whole: every followed listener there is, whichever
// changed, and an answer when one went (absent reads as deleted); a
// wildcard follows every listener.
func TestTableListeners(t *testing.T) {
	tb := newTable(resourcev3.ListenerType, "p-0")
	l := func(s string) types.Resource { return &listenerv3.Listener{Name: s} }
	if err := tb.update("p-1", map[string]types.Resource{"a": l("a"), "b": l("b"), "c": l("c")}, nil); err != nil {
		t.Fatal(err)
	}
	st := &sotwStream{wake: make(chan struct{}, 1)}
	sub := &sotwSub{st: st, t: tb, sent: map[string]string{}}
	sub.resubscribe([]string{"a", "b"})
	if got := answered(t, tb, sub, true); !same(got, []string{"a", "b"}) {
		t.Fatalf("first answer: %v, want [a b]", got)
	}
	if err := tb.update("p-2", map[string]types.Resource{"b": l("b")}, nil); err != nil {
		t.Fatal(err)
	}
	if got := answered(t, tb, sub, false); !same(got, []string{"a", "b"}) {
		t.Fatalf("after b's change: %v, want [a b]", got)
	}
	if err := tb.update("p-3", nil, []string{"a"}); err != nil {
		t.Fatal(err)
	}
	if got := answered(t, tb, sub, false); !same(got, []string{"b"}) {
		t.Fatalf("after a went: %v, want [b]", got)
	}
	wild := &sotwSub{st: st, t: tb, sent: map[string]string{}, legacy: true}
	wild.resubscribe(nil)
	if got := answered(t, tb, wild, true); !same(got, []string{"b", "c"}) {
		t.Fatalf("wildcard: %v, want [b c]", got)
	}
	<-st.wake // drained: the next change must wake it
	if err := tb.update("p-4", map[string]types.Resource{"d": l("d")}, nil); err != nil {
		t.Fatal(err)
	}
	select {
	case <-st.wake:
	default:
		t.Fatal("a new listener woke no wildcard stream")
	}
	if got := answered(t, tb, wild, false); !same(got, []string{"b", "c", "d"}) {
		t.Fatalf("wildcard after d: %v, want [b c d]", got)
	}
}
