package node

import "errors"

// The errors callers branch on (errors.Is).
var (
	// ErrInsecureListener is a listener on a non-loopback address that would
	// serve without TLS, refused unless Config.Insecure says so.
	ErrInsecureListener = errors.New("non-loopback listener without TLS")

	// ErrInvalidConfig is wrapped by every error of Config.Validate that names
	// a Config field (see package configerr; cmd/regnode maps the field to its
	// flag). The security checks (validateSecurity) still speak in flags, since
	// each concerns several of them.
	ErrInvalidConfig = errors.New("node: invalid config")
)
