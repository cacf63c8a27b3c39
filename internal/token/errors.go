package token

import (
	"errors"

	"github.com/regcluster/registry/internal/tokenformat"
)

// The errors callers of this package branch on (errors.Is).
var (
	// ErrExists is returned by Create for a name a token already has.
	ErrExists = errors.New("a token of this name exists")

	// ErrNotFound is returned by Revoke for a name no token has.
	ErrNotFound = errors.New("no token of this name")

	// ErrBadHeader is wrapped by FromIncoming for an authorization header
	// that is not one "Bearer <token>".
	ErrBadHeader = errors.New("malformed authorization metadata")

	// ErrJunk is a value under the tokens prefix that is not a Record.
	ErrJunk = errors.New("not a token record")

	// ErrMalformed is wrapped by Parse for a value that is not a token.
	ErrMalformed = tokenformat.ErrMalformed

	// ErrInvalidConfig is wrapped by every error of Config.Validate, and so
	// of NewCache (see package configerr).
	ErrInvalidConfig = errors.New("token: invalid config")
)
