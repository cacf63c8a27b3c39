package main

import (
	"context"
	"errors"
	"fmt"
	"io"
	"sync"
	"time"

	registryv1 "github.com/regcluster/registry/proto/registry/v1"
)

// Keys of the phases whose facts the summary (and its test) checks.
const (
	KeyHealthy  = "healthy"
	KeyAFailing = "a-failing"  // A toggled to failing, still in rotation
	KeyAOut     = "a-out"      // A failing, out of the client's rotation
	KeyAHalf    = "a-halfopen" // A healed, still ejected: half-open calls
	KeyARamp    = "a-ramp"     // A back, slow start (one phase per weight)
	KeyAFull    = "a-full"     // A back at full weight
	KeyBTransit = "b-transit"  // B drained in the registry, the client not yet told
	KeyBDrained = "b-drained"  // B out of the client's rotation
	KeyCKilled  = "c-killed"   // C kill -9'd, every phase after it
)

// phases names the story's phases; the caller tags each call with the
// phase current at its start.
type phases struct {
	mu    sync.Mutex
	names []string
	keys  []string
	at    []time.Time
}

func (p *phases) enter(key, name string) int {
	p.mu.Lock()
	defer p.mu.Unlock()
	p.names, p.keys, p.at = append(p.names, name), append(p.keys, key), append(p.at, time.Now())
	return len(p.names) - 1
}

func (p *phases) current() (int, string) {
	p.mu.Lock()
	defer p.mu.Unlock()
	if len(p.names) == 0 {
		return -1, ""
	}
	return len(p.names) - 1, p.names[len(p.names)-1]
}

// ErrStory is wrapped by a scripted story that could not go on: a
// condition not met within its bound.
var ErrStory = errors.New("the story did not go as scripted")

// Story is the scripted run of seed 001's experiment over a Stack.
type Story struct {
	st     *Stack
	out    io.Writer
	start  time.Time
	ph     *phases
	caller *Caller
	mon    *Monitor
	// bound is the longest any one condition may take; a loaded machine
	// only makes the story slower.
	bound time.Duration

	switches         []Switch
	aEjectedByClient bool
}

// Switch is how long one change took to show, from the action to the
// first call (or registry event) that reflects it.
type Switch struct {
	What string
	Took time.Duration
	Note string
}

func newStory(st *Stack, out io.Writer, start time.Time) *Story {
	s := &Story{st: st, out: out, start: start, ph: &phases{}, bound: 60 * time.Second}
	return s
}

func (s *Story) say(format string, args ...any) {
	fmt.Fprintf(s.out, "%6.1fs  ======== %s\n", time.Since(s.start).Seconds(), fmt.Sprintf(format, args...))
}

// waitFor polls cond every 20ms until it holds, ctx ends or the bound
// passes.
func (s *Story) waitFor(ctx context.Context, what string, cond func() bool) error {
	deadline := time.Now().Add(s.bound)
	t := time.NewTicker(20 * time.Millisecond)
	defer t.Stop()
	for !cond() {
		if time.Now().After(deadline) {
			return fmt.Errorf("%w: %s not within %v", ErrStory, what, s.bound)
		}
		select {
		case <-ctx.Done():
			return ctx.Err()
		case <-t.C:
		}
	}
	return nil
}

// calls waits for n more calls.
func (s *Story) calls(ctx context.Context, n int) error {
	target := s.caller.Len() + n
	return s.waitFor(ctx, fmt.Sprintf("%d more calls", n), func() bool { return s.caller.Len() >= target })
}

func (s *Story) health(id string) registryv1.HealthState {
	return s.st.View()[id].GetHealth().GetState()
}

// header says what runs where and what differs from the SDK's defaults.
func (s *Story) header() {
	s.say("%s", s.st.settings.describe())
	for _, id := range ids {
		where := "this process"
		if id == "C" {
			where = fmt.Sprintf("pid %d", s.st.CPid())
		}
		fmt.Fprintf(s.out, "          backend %s on %s (%s; gRPC Work; HTTP: curl http://%s/toggle_fail, /health, /work, /stats)\n",
			id, s.st.Addr(id), where, s.st.Addr(id))
	}
}

// Run plays the story and returns its summary.
func (s *Story) Run(ctx context.Context) (*Summary, error) {
	s.mon = StartMonitor(s.st, s.out, s.start)
	defer s.mon.Stop()
	s.header()
	s.say("waiting for the prober's first probes: an instance with a check takes calls once HEALTHY")
	if err := s.waitFor(ctx, "A, B and C HEALTHY and in the client's picker", func() bool {
		for _, id := range ids {
			if s.health(id) != registryv1.HealthState_HEALTH_STATE_HEALTHY || s.st.Weight(id) == 0 {
				return false
			}
		}
		return true
	}); err != nil {
		return nil, err
	}
	s.ph.enter("warm-up", "warm-up (slow start)")
	s.caller = StartCaller(s.st.cc, s.out, s.start, s.ph.current)
	defer func() {
		if s.caller != nil {
			s.caller.Stop()
		}
	}()
	if err := s.script(ctx); err != nil {
		if ctx.Err() == nil { // what happened up to the step that failed
			s.caller.Stop()
			s.summary(s.caller.Calls()).Render(s.out)
			s.caller = nil
		}
		return nil, err
	}
	s.caller.Stop()
	sum := s.summary(s.caller.Calls())
	s.caller = nil
	return sum, nil
}

func (s *Story) script(ctx context.Context) error {
	full := func(id string) func() bool {
		return func() bool { return s.st.Weight(id) == int64(weights[id]) }
	}
	s.say("all three registered: each ramps in by slow start from its routable_since (%v window)", s.st.settings.SlowStart)
	if err := s.waitFor(ctx, "A, B and C at full weight", func() bool { return full("A")() && full("B")() && full("C")() }); err != nil {
		return err
	}

	s.ph.enter(KeyHealthy, "all healthy")
	s.say("all healthy: calls split by weight (A 200 : B 100 : C 100)")
	if err := s.calls(ctx, 40); err != nil {
		return err
	}

	// A fails: the client ejects it after five failed attempts in a row
	// (retried on B or C, so no call fails), well before the prober's two
	// failed probes a second make the registry say UNAVAILABLE.
	s.say("toggle A to failing (GET /toggle_fail): Work answers Unavailable, /health 500")
	tA := time.Now()
	s.ph.enter(KeyAFailing, "A failing")
	if _, err := s.st.Toggle(ctx, "A"); err != nil {
		return err
	}
	ej := s.st.Counts().Ejections
	if err := s.waitFor(ctx, "A out of the client's rotation", func() bool { return s.st.Weight("A") == 0 }); err != nil {
		return err
	}
	// The client was first if it ejected A while the registry still
	// routed to it.
	byClient := s.st.Counts().Ejections > ej && s.health("A") != registryv1.HealthState_HEALTH_STATE_UNAVAILABLE
	s.aEjectedByClient = byClient
	s.ph.enter(KeyAOut, "A failing, out of rotation")
	if byClient {
		s.say("the client ejected A (consecutive failures); the registry has it %s", state(s.health("A").String()))
	} else {
		s.say("the registry marked A %s before the client ejected it", state(s.health("A").String()))
	}
	if err := s.waitFor(ctx, "the prober marking A UNAVAILABLE", func() bool {
		return s.health("A") == registryv1.HealthState_HEALTH_STATE_UNAVAILABLE
	}); err != nil {
		return err
	}
	if err := s.calls(ctx, 10); err != nil {
		return err
	}
	s.lastReach("A out of the client's rotation", tA, "A", KeyAFailing, KeyAOut, fmt.Sprintf("ejected by the client: %v", byClient))
	if at, ok := s.mon.First("A", "UNAVAILABLE", tA); ok {
		s.switches = append(s.switches, Switch{What: "registry marks A UNAVAILABLE", Took: at.Sub(tA), Note: "the prober's HTTP check"})
	}

	// A heals: the registry sees it first (one good probe: DEGRADED,
	// routable again); the client lets one call at a time through
	// (half-open) once the ejection is over, takes A back after two
	// successes, then ramps it by slow start.
	s.say("heal A (GET /toggle_fail again)")
	tH := time.Now()
	s.ph.enter(KeyAHalf, "A healed, half-open")
	if _, err := s.st.Toggle(ctx, "A"); err != nil {
		return err
	}
	last := int64(0)
	if err := s.waitFor(ctx, "A back at full weight and HEALTHY", func() bool {
		w := s.st.Weight("A")
		if w != last && w > 0 && w < int64(weights["A"]) {
			s.ph.enter(KeyARamp, fmt.Sprintf("A ramping, weight %d/%d", w, weights["A"]))
		}
		last = w
		return w == int64(weights["A"]) && s.health("A") == registryv1.HealthState_HEALTH_STATE_HEALTHY
	}); err != nil {
		return err
	}
	s.ph.enter(KeyAFull, "A back at full weight")
	if err := s.calls(ctx, 30); err != nil {
		return err
	}
	s.firstAnswer("A answers again", tH, "A")
	s.firstCallOf("A at full weight", tH, KeyAFull)

	// B drains: the registry's DRAINING reaches the client's resolver,
	// which takes B out of every list: no new call reaches it.
	s.say("drain B (as `regctl drain demo/B`)")
	tB := time.Now()
	s.ph.enter(KeyBTransit, "B draining, client not yet told")
	if err := s.st.Drain(ctx, "B"); err != nil {
		return err
	}
	if err := s.waitFor(ctx, "B out of the client's rotation", func() bool { return s.st.Weight("B") == 0 }); err != nil {
		return err
	}
	s.ph.enter(KeyBDrained, "B drained")
	if err := s.calls(ctx, 30); err != nil {
		return err
	}
	s.lastReach("B out of the client's rotation", tB, "B", KeyBTransit, KeyBDrained, "")

	// C dies while it serves a call: the calls ask for slow work until
	// one is in flight on C, then C gets SIGKILL. That call fails with
	// Unavailable after its request was sent, so only because Work is
	// idempotent is it retried, on A; the picker drops C as its
	// connection breaks; the prober marks it, and its record goes when
	// the lease expires, since nobody renews it.
	s.say("kill -9 C while it serves a call (the calls ask for %v of work until one is in flight on C)", slowWorkTime)
	s.ph.enter(KeyCKilled, "C killed during a call")
	s.caller.SetSlow(true)
	if err := s.waitFor(ctx, "a call in flight on C", func() bool {
		st, err := backendStats(ctx, s.st.http, s.st.Addr("C"))
		return err == nil && st.Inflight > 0
	}); err != nil {
		return err
	}
	tC := time.Now()
	s.st.KillC()
	s.caller.SetSlow(false)
	s.say("C killed (SIGKILL), its process reaped")
	if err := s.waitFor(ctx, "C out of the client's rotation", func() bool { return s.st.Weight("C") == 0 }); err != nil {
		return err
	}
	s.ph.enter(KeyCKilled, "C killed, out of rotation")
	if err := s.waitFor(ctx, "C's record gone (lease expired)", func() bool { _, ok := s.st.View()["C"]; return !ok }); err != nil {
		return err
	}
	s.ph.enter(KeyCKilled, "C killed, lease expired")
	if err := s.calls(ctx, 10); err != nil {
		return err
	}
	s.inflightRetried(tC)
	s.lastReach("C out of the client's rotation", tC, "C", KeyCKilled, KeyCKilled, "")
	if at, ok := s.mon.First("C", "UNAVAILABLE", tC); ok {
		s.switches = append(s.switches, Switch{What: "registry marks C UNAVAILABLE", Took: at.Sub(tC), Note: "the prober's HTTP check"})
	}
	if at, ok := s.mon.First("C", "gone", tC); ok {
		s.switches = append(s.switches, Switch{What: "C's record gone", Took: at.Sub(tC), Note: fmt.Sprintf("lease TTL %v, nobody renews it", s.st.settings.TTL)})
	}
	return nil
}

// lastReach records how long id took to leave the calls after the action
// at from: to the first call started after the last call (of the phases
// keyed a or b) that reached id; if none did, to the first call after
// from.
func (s *Story) lastReach(what string, from time.Time, id, a, b, note string) {
	calls := s.caller.Calls()
	lastIdx := -1
	for i, c := range calls {
		k := s.ph.keys[c.Phase]
		if !c.At.Before(from) && (k == a || k == b) && c.reached(id) {
			lastIdx = i
		}
	}
	for i, c := range calls {
		if c.At.Before(from) || i <= lastIdx {
			continue
		}
		s.switches = append(s.switches, Switch{What: what, Took: c.At.Sub(from), Note: note})
		return
	}
}

// inflightRetried records the call that was in flight on C when it died.
func (s *Story) inflightRetried(killed time.Time) {
	for _, c := range s.caller.Calls() {
		if s.ph.keys[c.Phase] != KeyCKilled || len(c.Tries) < 2 || c.Tries[0].ID != "C" || c.Err != nil {
			continue
		}
		s.switches = append(s.switches, Switch{What: "the call in flight on C", Took: c.At.Add(c.Duration).Sub(killed),
			Note: fmt.Sprintf("C's attempt: %s; retried and answered by %s", c.Tries[0].Code, c.Answer)})
		return
	}
}

func (s *Story) firstAnswer(what string, from time.Time, id string) {
	for _, c := range s.caller.Calls() {
		if !c.At.Before(from) && c.Answer == id {
			s.switches = append(s.switches, Switch{What: what, Took: c.At.Sub(from), Note: "half-open, then two successes"})
			return
		}
	}
}

func (s *Story) firstCallOf(what string, from time.Time, key string) {
	for _, c := range s.caller.Calls() {
		if s.ph.keys[c.Phase] == key {
			s.switches = append(s.switches, Switch{What: what, Took: c.At.Sub(from),
				Note: fmt.Sprintf("slow start %v from the later of routable_since and the return", s.st.settings.SlowStart)})
			return
		}
	}
}
