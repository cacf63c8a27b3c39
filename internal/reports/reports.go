// Package reports aggregates callers' reports of their calls to instances
// (health at scale: passive health from many callers). A regnode that
// owns an instance takes every report about it, from its own clients and
// forwarded by other regnodes, and says how many distinct callers see it
// failing while their calls to its peers succeed.
//
// What it guarantees:
//   - A reporter counts for an instance only while its latest report
//     about it (within Window) had it ejected, or at least MinFailures
//     instance-level failures and no more successes than failures, and
//     successes on some other instance of the service: a caller whose calls fail
//     everywhere is discounted (its own network is the likelier cause).
//   - A later report in which the reporter's calls to the instance
//     succeed (and none fail) withdraws its vote at once.
//   - Memory is bounded: at most MaxInstances instances and MaxReporters
//     reporters per instance are tracked; past them reports are dropped
//     (and counted), and entries older than Window are pruned.
//   - It reads no clock (times are inputs) and owns no goroutine.
package reports

import (
	"errors"
	"sync"
	"time"

	"github.com/regcluster/registry/internal/configerr"
)

// ErrInvalidConfig is wrapped by every error of Config.Validate.
var ErrInvalidConfig = errors.New("reports: invalid config")

// Config configures an Aggregator; zero fields take DefaultConfig's.
type Config struct {
	// Window is how long a report counts (0: 30s).
	Window time.Duration
	// MinFailures is the fewest failures in one report that count
	// (0: 3).
	MinFailures uint32
	// MaxInstances and MaxReporters bound what is kept (0: 100000, 64).
	MaxInstances, MaxReporters int
}

// DefaultConfig is a Config with every default.
func DefaultConfig() Config {
	return Config{Window: 30 * time.Second, MinFailures: 3, MaxInstances: 100000, MaxReporters: 64}
}

func (c Config) withDefaults() Config {
	d := DefaultConfig()
	if c.Window == 0 {
		c.Window = d.Window
	}
	if c.MinFailures == 0 {
		c.MinFailures = d.MinFailures
	}
	if c.MaxInstances == 0 {
		c.MaxInstances = d.MaxInstances
	}
	if c.MaxReporters == 0 {
		c.MaxReporters = d.MaxReporters
	}
	return c
}

// Validate reports the first field that cannot work.
func (c Config) Validate() error {
	c = c.withDefaults()
	bad := func(field string, v any) error {
		return configerr.New(ErrInvalidConfig, "reports", field, v, "must be >= 0 (0: the default)")
	}
	switch {
	case c.Window < 0:
		return bad("Window", c.Window)
	case c.MaxInstances < 0:
		return bad("MaxInstances", c.MaxInstances)
	case c.MaxReporters < 0:
		return bad("MaxReporters", c.MaxReporters)
	}
	return nil
}

// Calls is one instance's calls in a report.
type Calls struct {
	ID                  string
	Failures, Successes uint32
	// Ejected: the caller's outlier detection holds it out now.
	Ejected bool
}

type key struct{ service, id string }

// Aggregator keeps the reports of the instances a regnode owns. It is
// safe for concurrent use.
type Aggregator struct {
	cfg Config

	mu       sync.Mutex
	failing  map[key]map[string]time.Time // reporter -> when it last reported the instance failing
	adds     int
	received uint64
	counted  uint64
	ignored  uint64 // discounted reporters
	dropped  uint64 // past the bounds
}

// New returns an Aggregator; it fails only if cfg does not Validate.
func New(cfg Config) (*Aggregator, error) {
	if err := cfg.Validate(); err != nil {
		return nil, err
	}
	return &Aggregator{cfg: cfg.withDefaults(), failing: map[key]map[string]time.Time{}}, nil
}

// Add takes one report of reporter about service's instances, made at
// now, and returns the instances whose count of failing reporters it
// raised, and whether it was discounted (the reporter's calls failed
// everywhere).
func (a *Aggregator) Add(reporter, service string, calls []Calls, now time.Time) (raised []string, discounted bool) {
	var ok uint64
	everywhere := len(calls) > 0
	for _, c := range calls {
		ok += uint64(c.Successes)
		everywhere = everywhere && (c.Failures > 0 || c.Ejected) && c.Successes == 0
	}
	a.mu.Lock()
	defer a.mu.Unlock()
	a.received++
	if everywhere {
		a.ignored++
		return nil, true
	}
	a.adds++
	if a.adds%1024 == 0 {
		a.pruneLocked(now)
	}
	for _, c := range calls {
		k := key{service, c.ID}
		peersOK := ok-uint64(c.Successes) > 0
		switch {
		case (c.Ejected || c.Failures >= a.cfg.MinFailures && c.Failures >= c.Successes) && peersOK:
			m := a.failing[k]
			if m == nil {
				if len(a.failing) >= a.cfg.MaxInstances {
					a.dropped++
					continue
				}
				m = map[string]time.Time{}
				a.failing[k] = m
			}
			if _, seen := m[reporter]; !seen && len(m) >= a.cfg.MaxReporters {
				a.dropped++
				continue
			}
			_, was := m[reporter]
			m[reporter] = now
			a.counted++
			if !was {
				raised = append(raised, c.ID)
			}
		case c.Failures == 0 && !c.Ejected && c.Successes > 0:
			if m := a.failing[k]; m != nil {
				delete(m, reporter)
				if len(m) == 0 {
					delete(a.failing, k)
				}
			}
		}
	}
	return raised, false
}

// Failing is how many distinct reporters see service/id failing at now.
func (a *Aggregator) Failing(service, id string, now time.Time) int {
	a.mu.Lock()
	defer a.mu.Unlock()
	k := key{service, id}
	m := a.failing[k]
	for r, at := range m {
		if now.Sub(at) >= a.cfg.Window {
			delete(m, r)
		}
	}
	if m != nil && len(m) == 0 {
		delete(a.failing, k)
	}
	return len(m)
}

func (a *Aggregator) pruneLocked(now time.Time) {
	for k, m := range a.failing {
		for r, at := range m {
			if now.Sub(at) >= a.cfg.Window {
				delete(m, r)
			}
		}
		if len(m) == 0 {
			delete(a.failing, k)
		}
	}
}

// Stats are an Aggregator's counters.
type Stats struct {
	// Received counts reports; Counted the instance failures they made
	// count; Discounted the reports of callers failing everywhere;
	// Dropped the entries past the bounds.
	Received, Counted, Discounted, Dropped uint64
}

// Stats returns the counters.
func (a *Aggregator) Stats() Stats {
	a.mu.Lock()
	defer a.mu.Unlock()
	return Stats{Received: a.received, Counted: a.counted, Discounted: a.ignored, Dropped: a.dropped}
}
