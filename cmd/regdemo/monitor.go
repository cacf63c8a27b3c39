package main

import (
	"context"
	"fmt"
	"io"
	"strings"
	"sync"
	"time"

	registryv1 "github.com/regcluster/registry/proto/registry/v1"
)

// Event is a change of the registry's record of one instance, as the
// client's subscription saw it.
type Event struct {
	At   time.Time
	ID   string
	What string // "registered", "gone", a health or lifecycle state ("UNAVAILABLE", "DRAINING")
}

// Monitor prints what the registry says of each instance whenever it
// changes (health from the prober, lifecycle from a drain, the record's
// coming and going) and what the client's picker does with it, and keeps
// the times. It reads the local view and counters every 20ms: cheap, and
// the changes it reports are seconds apart.
type Monitor struct {
	st    *Stack
	out   io.Writer
	start time.Time

	mu     sync.Mutex
	events []Event

	cancel context.CancelFunc
	done   chan struct{}
}

// StartMonitor starts watching st.
func StartMonitor(st *Stack, out io.Writer, start time.Time) *Monitor {
	ctx, cancel := context.WithCancel(context.Background())
	m := &Monitor{st: st, out: out, start: start, cancel: cancel, done: make(chan struct{})}
	go m.run(ctx)
	return m
}

type seen struct {
	present   bool
	health    registryv1.HealthState
	lifecycle registryv1.Lifecycle
	weight    int64 // in the picker
}

func (m *Monitor) run(ctx context.Context) {
	defer close(m.done)
	last := map[string]seen{}
	var lastCounts struct{ ej, ret, half int64 }
	t := time.NewTicker(20 * time.Millisecond)
	defer t.Stop()
	for {
		select {
		case <-ctx.Done():
			return
		case <-t.C:
		}
		now := time.Now()
		view := m.st.View()
		for _, id := range ids {
			in, ok := view[id]
			cur := seen{present: ok, weight: m.st.Weight(id)}
			if ok {
				cur.health, cur.lifecycle = in.GetHealth().GetState(), in.GetLifecycle()
			}
			old := last[id]
			switch {
			case cur.present && !old.present:
				m.add(now, id, "registered", fmt.Sprintf("%s registered at %s, weight %d, %s, %s", id, in.GetAddress(),
					in.GetWeight(), state(cur.lifecycle.String()), state(cur.health.String())))
			case !cur.present && old.present:
				m.add(now, id, "gone", id+" is no longer registered (deregistered, or its lease expired)")
			case cur.present:
				if cur.health != old.health {
					h := state(cur.health.String())
					m.add(now, id, h, fmt.Sprintf("%s: %s -> %s (%s)", id, state(old.health.String()), h, in.GetHealth().GetReason()))
				}
				if cur.lifecycle != old.lifecycle {
					l := state(cur.lifecycle.String())
					m.add(now, id, l, fmt.Sprintf("%s: %s -> %s %s", id, state(old.lifecycle.String()), l, in.GetLifecycleReason()))
				}
			}
			if cur.weight != old.weight {
				m.print(now, "picker ", fmt.Sprintf("%s: weight %d -> %d%s", id, old.weight, cur.weight, weightNote(id, cur.weight)))
			}
			last[id] = cur
		}
		c := m.st.Counts()
		if c.Ejections != lastCounts.ej || c.Returns != lastCounts.ret || c.HalfOpenProbes != lastCounts.half {
			m.print(now, "picker ", fmt.Sprintf("ejections %d, half-open calls %d, returns %d", c.Ejections, c.HalfOpenProbes, c.Returns))
			lastCounts.ej, lastCounts.ret, lastCounts.half = c.Ejections, c.Returns, c.HalfOpenProbes
		}
	}
}

func weightNote(id string, w int64) string {
	full := int64(weights[id])
	switch {
	case w == 0:
		return " (not picked: ejected, not routable, draining or not connected)"
	case w == full:
		return " (full weight)"
	default:
		return fmt.Sprintf(" (%d%% of %d: slow start, or DEGRADED's quarter)", w*100/full, full)
	}
}

func state(s string) string {
	for _, p := range []string{"HEALTH_STATE_", "LIFECYCLE_"} {
		s = strings.TrimPrefix(s, p)
	}
	return s
}

func (m *Monitor) add(at time.Time, id, what, line string) {
	m.mu.Lock()
	m.events = append(m.events, Event{At: at, ID: id, What: what})
	m.mu.Unlock()
	m.print(at, "registry", line)
}

func (m *Monitor) print(at time.Time, who, line string) {
	fmt.Fprintf(m.out, "%6.1fs  %s | %s\n", at.Sub(m.start).Seconds(), who, line)
}

// First is the first event of id with what at or after from (ok false if
// none yet).
func (m *Monitor) First(id, what string, from time.Time) (time.Time, bool) {
	m.mu.Lock()
	defer m.mu.Unlock()
	for _, e := range m.events {
		if e.ID == id && e.What == what && !e.At.Before(from) {
			return e.At, true
		}
	}
	return time.Time{}, false
}

// Stop ends the monitor and waits for it.
func (m *Monitor) Stop() {
	m.cancel()
	<-m.done
}
