package client

import (
	"fmt"
	"log/slog"
	"strings"
	"time"

	"github.com/regcluster/registry/internal/configerr"
	"github.com/regcluster/registry/lease"
	"github.com/regcluster/registry/record"
)

// DefaultConfig is the Config a zero Config runs with: every zero field of
// a Config takes the value stated here.
func DefaultConfig() Config {
	p := DefaultPolicy()
	return Config{Endpoints: []string{DefaultEndpoint}, Policy: &p, CacheMaxAge: DefaultCacheMaxAge,
		ConnectTimeout: DefaultConnectTimeout, CloseTimeout: DefaultCloseTimeout, Subscriber: subscriberName(""),
		ReportInterval: DefaultReportInterval}
}

// withDefaults is c with its zero fields set to DefaultConfig's and its
// endpoints trimmed: the one place defaults are filled, for Validate and
// New. It does not change the caller's slices.
func (c Config) withDefaults() Config {
	d := DefaultConfig()
	if len(c.Endpoints) == 0 {
		c.Endpoints = d.Endpoints
	} else {
		eps := make([]string, len(c.Endpoints))
		for i, ep := range c.Endpoints {
			eps[i] = strings.TrimSpace(ep)
		}
		c.Endpoints = eps
	}
	if c.Logger == nil {
		c.Logger = slog.Default()
	}
	if c.Policy == nil {
		c.Policy = d.Policy
	}
	if c.CacheMaxAge == 0 {
		c.CacheMaxAge = d.CacheMaxAge
	}
	if c.ConnectTimeout == 0 {
		c.ConnectTimeout = d.ConnectTimeout
	}
	if c.ReportInterval == 0 {
		c.ReportInterval = d.ReportInterval
	}
	if c.CloseTimeout == 0 {
		c.CloseTimeout = d.CloseTimeout
	}
	if c.Subscriber == "" {
		c.Subscriber = d.Subscriber
	}
	return c
}

// Validate reports the first field that cannot work, with its defaults
// filled, as an error wrapping ErrInvalidConfig: an endpoint that is not
// host:port, a policy balance refuses, a LastResort lastresort refuses, a negative CacheMaxAge,
// ConnectTimeout or CloseTimeout, a malformed Token or one that would cross the network in
// plaintext (ErrInsecureToken). It does no I/O (New creates CacheDir).
func (c Config) Validate() error {
	c = c.withDefaults()
	because := func(field string, v any, err error) error {
		return configerr.Because(ErrInvalidConfig, "client", field, v, err)
	}
	bad := func(field string, v any) error {
		return configerr.New(ErrInvalidConfig, "client", field, v, "must be >= 0 (0: the default)")
	}
	for _, ep := range c.Endpoints {
		if err := record.ValidAddress(ep); err != nil {
			return because("Endpoints", ep, err)
		}
	}
	if err := c.Policy.Validate(); err != nil {
		return because("Policy", nil, err)
	}
	for svc, p := range c.Policies {
		field := fmt.Sprintf("Policies[%q]", svc)
		if err := record.ValidService(svc); err != nil {
			return because(field, nil, err)
		}
		if err := p.Validate(); err != nil {
			return because(field, nil, err)
		}
	}
	switch {
	case c.CacheMaxAge < 0:
		return bad("CacheMaxAge", c.CacheMaxAge)
	case c.ConnectTimeout < 0:
		return bad("ConnectTimeout", c.ConnectTimeout)
	case c.CloseTimeout < 0:
		return bad("CloseTimeout", c.CloseTimeout)
	}
	if err := c.LastResort.Validate(); err != nil {
		return because("LastResort", nil, err)
	}
	if _, err := tokenOption(c, c.Endpoints); err != nil {
		return because("Token", nil, err) // never the token itself
	}
	return nil
}

// DefaultSubscribeOptions is the SubscribeOptions a zero one runs with.
func DefaultSubscribeOptions() SubscribeOptions {
	return SubscribeOptions{MinBackoff: 50 * time.Millisecond, MaxBackoff: 2 * time.Second,
		ReceiveDeadline: DefaultReceiveDeadline, CallbackBacklog: DefaultCallbackBacklog}
}

// withDefaults is o with its zero fields set to DefaultSubscribeOptions'.
func (o SubscribeOptions) withDefaults() SubscribeOptions {
	d := DefaultSubscribeOptions()
	if o.MinBackoff == 0 {
		o.MinBackoff = d.MinBackoff
	}
	if o.MaxBackoff == 0 {
		o.MaxBackoff = max(d.MaxBackoff, o.MinBackoff)
	}
	if o.ReceiveDeadline == 0 {
		o.ReceiveDeadline = d.ReceiveDeadline
	}
	if o.CallbackBacklog == 0 {
		o.CallbackBacklog = d.CallbackBacklog
	}
	return o
}

// Validate reports the first field that cannot work, with its defaults
// filled, as an error wrapping ErrInvalidConfig: a negative Changes,
// CallbackBacklog or MinBackoff, a MaxBackoff below MinBackoff, a
// ReceiveDeadline below MinReceiveDeadline.
func (o SubscribeOptions) Validate() error {
	o = o.withDefaults()
	bad := func(field string, v any, rule string) error {
		return configerr.New(ErrInvalidConfig, "client", field, v, rule).Of("SubscribeOptions")
	}
	switch {
	case o.Changes < 0:
		return bad("Changes", o.Changes, "must be >= 0 (0: no Changes channel)")
	case o.CallbackBacklog < 0:
		return bad("CallbackBacklog", o.CallbackBacklog, "must be >= 0 (0: the default)")
	case o.MinBackoff < 0:
		return bad("MinBackoff", o.MinBackoff, "must be >= 0 (0: the default)")
	case o.MaxBackoff < o.MinBackoff:
		return bad("MaxBackoff", o.MaxBackoff, fmt.Sprintf("must be >= MinBackoff %s (0: the default)", o.MinBackoff))
	case o.ReceiveDeadline < MinReceiveDeadline:
		return bad("ReceiveDeadline", o.ReceiveDeadline,
			fmt.Sprintf("must be at least %s, twice regnode's progress interval (0: the default)", MinReceiveDeadline))
	}
	return nil
}

// DefaultRegisterOptions is the RegisterOptions a zero one runs with
// (lease.DefaultConfig's TTL and DrainGrace).
func DefaultRegisterOptions() RegisterOptions {
	d := lease.DefaultConfig()
	return RegisterOptions{TTL: d.TTL, DrainGrace: d.DrainGrace}
}

// Validate reports a TTL outside record.MinTTL..record.MaxTTL or a
// negative DrainGrace (zero takes the default), as an error wrapping
// ErrInvalidConfig.
func (o RegisterOptions) Validate() error {
	if err := record.ValidTTL(o.TTL); err != nil {
		return configerr.Because(ErrInvalidConfig, "client", "TTL", o.TTL, err).Of("RegisterOptions")
	}
	if o.DrainGrace < 0 {
		return configerr.New(ErrInvalidConfig, "client", "DrainGrace", o.DrainGrace, "must be >= 0 (0: the default)").Of("RegisterOptions")
	}
	return nil
}
