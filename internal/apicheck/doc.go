// Package apicheck holds the module's checks of its public API, as tests:
// no exported name of a package outside internal/ has a type that names an
// internal package's type (a caller outside the module could see it but
// never build or name it). It has no code of its own.
package apicheck
