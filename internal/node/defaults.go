package node

import (
	"log/slog"

	"github.com/regcluster/registry/health"
	"github.com/regcluster/registry/internal/configerr"
	"github.com/regcluster/registry/internal/peerlimit"
)

// invalid is the refusal of field, holding v, by rule.
func invalid(field string, v any, rule string) error {
	return configerr.New(ErrInvalidConfig, "node", field, v, rule)
}

// withDefaults is c with each zero field that DefaultConfig sets taken
// from it, and the API limits' zeros filled: the one place a regnode's
// defaults are filled, for Validate and Start. (Embed is filled by
// package embedded, Logger here with slog.Default().)
func (c Config) withDefaults() Config {
	d := DefaultConfig()
	if c.Listen == "" {
		c.Listen = d.Listen
	}
	if c.MetricsListen == "" {
		c.MetricsListen = d.MetricsListen
	}
	if c.Prefix == "" {
		c.Prefix = d.Prefix
	}
	if c.ReportQuorum == 0 {
		c.ReportQuorum = d.ReportQuorum
	}
	if c.ReportWindow == 0 {
		c.ReportWindow = d.ReportWindow
	}
	if c.SessionTTL == 0 {
		c.SessionTTL = d.SessionTTL
	}
	if c.ShutdownGrace == 0 {
		c.ShutdownGrace = d.ShutdownGrace
	}
	if c.ProbeInterval == 0 {
		c.ProbeInterval = d.ProbeInterval
	}
	if c.ProbeTimeout == 0 {
		c.ProbeTimeout = d.ProbeTimeout
	}
	if c.ProbeConcurrency == 0 {
		c.ProbeConcurrency = d.ProbeConcurrency
	}
	if c.RingSize == 0 {
		c.RingSize = d.RingSize
	}
	if c.QueueSize == 0 {
		c.QueueSize = d.QueueSize
	}
	if c.Thresholds == (health.Thresholds{}) {
		c.Thresholds = d.Thresholds
	}
	if c.Limits == (peerlimit.Config{}) {
		c.Limits = d.Limits
	}
	if c.OperatorDeregister == "" {
		c.OperatorDeregister = d.OperatorDeregister
	}
	c.defaultAPILimits()
	if c.Logger == nil {
		c.Logger = slog.Default()
	}
	return c
}
