package node

import (
	"errors"

	"github.com/regcluster/registry/internal/configerr"
)

// ErrInvalidConfig is wrapped by every error of Config.Validate that names
// a Config field (see package configerr; cmd/regnode maps the field to its
// flag). The security checks (validateSecurity) still speak in flags, since
// each concerns several of them.
var ErrInvalidConfig = errors.New("node: invalid config")

// invalid is the refusal of field, holding v, by rule.
func invalid(field string, v any, rule string) error {
	return configerr.New(ErrInvalidConfig, "node", field, v, rule)
}
