package main

import (
	"fmt"
	"io"
	"strings"
	"text/tabwriter"
	"time"

	"google.golang.org/grpc/codes"
)

// PhaseStats are the calls of one phase of the story.
type PhaseStats struct {
	Key, Name string
	Calls     int
	Failed    int // calls that returned an error to the caller
	Retried   int // calls that took more than one attempt
	Answers   map[string]int
	Attempts  map[string]int // every attempt, answered or not
	FailedAt  map[string]int // attempts that failed, by instance
	Duration  time.Duration
}

// Summary is the story's outcome: the phases in order, and how long each
// switch took.
type Summary struct {
	Phases   []PhaseStats
	Switches []Switch
	// ClientEjectedA: the client took failing A out of rotation before
	// the registry marked it UNAVAILABLE.
	ClientEjectedA bool
	// Client-side counts over the whole run.
	Ejections, HalfOpenProbes, Returns, Retries int64
}

// ByKey returns the phases of key merged into one (Name is the first's).
func (s *Summary) ByKey(key string) PhaseStats {
	out := PhaseStats{Key: key, Answers: map[string]int{}, Attempts: map[string]int{}, FailedAt: map[string]int{}}
	for _, p := range s.Phases {
		if p.Key != key {
			continue
		}
		if out.Name == "" {
			out.Name = p.Name
		}
		out.Calls += p.Calls
		out.Failed += p.Failed
		out.Retried += p.Retried
		out.Duration += p.Duration
		for id, n := range p.Answers {
			out.Answers[id] += n
		}
		for id, n := range p.Attempts {
			out.Attempts[id] += n
		}
		for id, n := range p.FailedAt {
			out.FailedAt[id] += n
		}
	}
	return out
}

func (s *Story) summary(calls []Call) *Summary {
	sum := &Summary{Switches: s.switches, ClientEjectedA: s.aEjectedByClient}
	s.ph.mu.Lock()
	for i := range s.ph.names {
		end := time.Now()
		if i+1 < len(s.ph.at) {
			end = s.ph.at[i+1]
		}
		sum.Phases = append(sum.Phases, PhaseStats{Key: s.ph.keys[i], Name: s.ph.names[i], Duration: end.Sub(s.ph.at[i]),
			Answers: map[string]int{}, Attempts: map[string]int{}, FailedAt: map[string]int{}})
	}
	s.ph.mu.Unlock()
	for _, c := range calls {
		p := &sum.Phases[c.Phase]
		p.Calls++
		if c.Err != nil {
			p.Failed++
		} else {
			p.Answers[c.Answer]++
		}
		if len(c.Tries) > 1 {
			p.Retried++
		}
		for _, t := range c.Tries {
			p.Attempts[t.ID]++
			if t.Code != codes.OK {
				p.FailedAt[t.ID]++
			}
		}
	}
	cs := s.st.Counts()
	sum.Ejections, sum.HalfOpenProbes, sum.Returns, sum.Retries = cs.Ejections, cs.HalfOpenProbes, cs.Returns, cs.Retries
	return sum
}

// Render writes the summary table: per phase, the calls, failures,
// retried calls, and each instance's share of the answers (with its
// failed attempts, which the retries hid from the caller); then the
// switches.
func (s *Summary) Render(w io.Writer) {
	fmt.Fprintln(w)
	fmt.Fprintln(w, "Summary (share: of the calls answered in the phase; \"+n failed\": attempts that failed there and were retried elsewhere)")
	tw := tabwriter.NewWriter(w, 0, 0, 2, ' ', 0)
	fmt.Fprintf(tw, "phase\ttime\tcalls\tfailed\tretried\t%s\t\n", strings.Join(ids, "\t"))
	total := PhaseStats{Answers: map[string]int{}}
	for _, p := range s.Phases {
		if p.Calls == 0 {
			continue
		}
		cells := make([]string, len(ids))
		answered := p.Calls - p.Failed
		for i, id := range ids {
			share := 0.0
			if answered > 0 {
				share = float64(p.Answers[id]) * 100 / float64(answered)
			}
			cells[i] = fmt.Sprintf("%3.0f%% %3d", share, p.Answers[id])
			if n := p.FailedAt[id]; n > 0 {
				cells[i] += fmt.Sprintf(" +%d failed", n)
			}
		}
		fmt.Fprintf(tw, "%s\t%.1fs\t%d\t%d\t%d\t%s\t\n", p.Name, p.Duration.Seconds(), p.Calls, p.Failed, p.Retried, strings.Join(cells, "\t"))
		total.Calls += p.Calls
		total.Failed += p.Failed
		total.Retried += p.Retried
	}
	fmt.Fprintf(tw, "total\t\t%d\t%d\t%d\t\t\t\t\n", total.Calls, total.Failed, total.Retried)
	tw.Flush()
	if len(s.Switches) > 0 {
		fmt.Fprintln(w)
		fmt.Fprintln(w, "Switches (from the action to the first call, or registry event, that shows it):")
		tw = tabwriter.NewWriter(w, 0, 0, 2, ' ', 0)
		for _, sw := range s.Switches {
			fmt.Fprintf(tw, "  %s\t%.2fs\t%s\n", sw.What, sw.Took.Seconds(), sw.Note)
		}
		tw.Flush()
	}
	fmt.Fprintf(w, "\nclient: %d ejections, %d half-open calls, %d returns, %d retries\n", s.Ejections, s.HalfOpenProbes, s.Returns, s.Retries)
}
