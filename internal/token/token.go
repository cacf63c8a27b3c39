// Package token owns the registry's scoped tokens (regnode --auth): their
// format, how they are stored (hashed, in etcd under <prefix>auth/tokens/),
// the cache every regnode keeps of them from one etcd watch, and the one
// check every call passes: a token, a method and a service give nil,
// Unauthenticated or PermissionDenied naming the service and the role
// needed.
//
// The token's text form is package internal/tokenformat's (which the SDK
// uses without linking etcd); this package names it too.
package token

import "github.com/regcluster/registry/internal/tokenformat"

// Prefix starts every token.
const Prefix = tokenformat.Prefix

// SecretBytes is the number of random bytes in a token.
const SecretBytes = tokenformat.SecretBytes

// Len is the length of every token: Prefix and the base64 of SecretBytes.
var Len = tokenformat.Len

// New returns a fresh token (tokenformat.New).
func New() string { return tokenformat.New() }

// Parse checks that s is exactly a token (tokenformat.Parse); its error
// never quotes s.
func Parse(s string) error { return tokenformat.Parse(s) }

// Hash is what the registry stores for token s (tokenformat.Hash).
func Hash(s string) string { return tokenformat.Hash(s) }
