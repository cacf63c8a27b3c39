package lastresort

import (
	"fmt"
	"time"

	registryv1 "github.com/regcluster/registry/proto/registry/v1"
)

// Defaults of Config.
const (
	// DefaultWindow is one default lease TTL (record.DefaultTTL): the
	// leases an incident revokes or lets expire are gone within one TTL of
	// each other, since their keepalives are spread over it.
	DefaultWindow = 10 * time.Second
	// DefaultGrace is long enough for a lost registration to come back by
	// itself (the SDK registers again within a TTL of its lease's loss,
	// 10 s by default, and an etcd leader election or restore takes
	// seconds to tens of seconds), and short enough that the addresses of
	// a fleet that really died stop being called within minutes, and
	// only when nothing else was routable anyway.
	DefaultGrace = 2 * time.Minute
	// DefaultFraction: at least half the routable instances vanishing at
	// once is an incident of the registry, not a crash of a few backends
	// (those an outlier ejector handles, and their peers are still
	// routable).
	DefaultFraction = 0.5
)

// Config configures a Tracker. DefaultConfig has every default; New
// refuses what Validate refuses.
type Config struct {
	// Window is how close together vanishings must be to count as one
	// incident (default DefaultWindow).
	Window time.Duration
	// Grace is how long vanished instances are kept as a last resort from
	// the moment it starts (default DefaultGrace).
	Grace time.Duration
	// Fraction is the share of the routable instances the service had
	// just before that must vanish within Window for the last resort to
	// start, in (0, 1] (default DefaultFraction).
	Fraction float64
	// Off keeps nothing: the Tracker never starts a last resort (for a
	// caller that must route by the registry's views alone, such as a
	// checker that judges every call by them).
	Off bool
	// OnStart, if set, is called when a service's last resort starts,
	// with the instances kept (the Tracker's own: not to be modified) and
	// when the grace ends. It is called after the Tracker's lock is
	// released, on the goroutine of the call that started it.
	OnStart func(service string, kept []*registryv1.Instance, until time.Time)
	// OnEnd, if set, is called once when a service's last resort ends,
	// with why; as OnStart is.
	OnEnd func(service string, why EndReason)
}

// DefaultConfig returns a Config with every default.
func DefaultConfig() Config {
	return Config{Window: DefaultWindow, Grace: DefaultGrace, Fraction: DefaultFraction}
}

// Validate reports the first field out of range; zero durations and
// fraction take their defaults and are valid.
func (c Config) Validate() error {
	switch {
	case c.Window < 0:
		return fmt.Errorf("%w: Window %s is negative", ErrConfig, c.Window)
	case c.Grace < 0:
		return fmt.Errorf("%w: Grace %s is negative", ErrConfig, c.Grace)
	case c.Fraction < 0 || c.Fraction > 1 || c.Fraction != c.Fraction:
		return fmt.Errorf("%w: Fraction %v is not in (0, 1]", ErrConfig, c.Fraction)
	}
	return nil
}

func (c Config) withDefaults() Config {
	d := DefaultConfig()
	if c.Window == 0 {
		c.Window = d.Window
	}
	if c.Grace == 0 {
		c.Grace = d.Grace
	}
	if c.Fraction == 0 {
		c.Fraction = d.Fraction
	}
	return c
}
