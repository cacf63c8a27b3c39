package store

import (
	"log/slog"
	"time"

	"github.com/regcluster/registry/internal/configerr"
	"github.com/regcluster/registry/record"
)

// DefaultConfig is a Config with every default but the client. A zero
// field of a Config takes the default stated here: Prefix
// record.DefaultPrefix, PageSize 1000 keys in the first range read (one read is
// then at most about 16 MiB of records at their size cap; later ones grow
// with small records, see etcdread.Range), Logger
// slog.Default(), Now time.Now; Leases, Commit and Renew are optional
// (nil: Register grants its own lease and sends its own Txn, KeepAliveAs
// opens a stream per renewal). A negative PageSize is refused.
func DefaultConfig() Config {
	return Config{Prefix: record.DefaultPrefix, PageSize: 1000, Now: time.Now}
}

// withDefaults is c with its zero fields set to DefaultConfig's: the one
// place defaults are filled, for Validate and New.
func (c Config) withDefaults() Config {
	d := DefaultConfig()
	if c.Prefix == "" {
		c.Prefix = d.Prefix
	}
	if c.PageSize == 0 {
		c.PageSize = d.PageSize
	}
	if c.Now == nil {
		c.Now = d.Now
	}
	if c.Logger == nil {
		c.Logger = slog.Default()
	}
	return c
}

// Validate reports the first field that cannot work, with its defaults
// filled, as a *configerr.Error wrapping ErrInvalidConfig: a missing
// Client or a negative PageSize.
func (c Config) Validate() error {
	c = c.withDefaults()
	switch {
	case c.Client == nil:
		return configerr.Required(ErrInvalidConfig, "store", "Client")
	case c.PageSize < 0:
		return configerr.New(ErrInvalidConfig, "store", "PageSize", c.PageSize, "must be >= 0 (0: the default)")
	}
	return nil
}
