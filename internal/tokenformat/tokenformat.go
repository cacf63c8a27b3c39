// Package tokenformat is the text form of the registry's scoped tokens:
// making one (New), checking one (Parse) and what is stored of one
// (Hash). It imports nothing of etcd, so the SDK can refuse a malformed
// Config.Token without linking the token store (package internal/token).
//
// A token is "regtok_" followed by 32 random bytes in unpadded URL base64:
// the prefix makes one recognisable in a log, a diff or a secret scanner,
// and Parse accepts nothing else. The registry stores only Hash of it.
package tokenformat

import (
	"crypto/rand"
	"crypto/sha256"
	"encoding/base64"
	"encoding/hex"
	"errors"
	"fmt"
	"strings"
)

// Prefix starts every token.
const Prefix = "regtok_"

// SecretBytes is the number of random bytes in a token.
const SecretBytes = 32

// Len is the length of every token: Prefix and the base64 of SecretBytes.
var Len = len(Prefix) + base64.RawURLEncoding.EncodedLen(SecretBytes)

// ErrMalformed is wrapped by Parse for a value that is not a token.
var ErrMalformed = errors.New("not a registry token")

var enc = base64.RawURLEncoding.Strict()

// New returns a fresh token from crypto/rand.
func New() string {
	var b [SecretBytes]byte
	if _, err := rand.Read(b[:]); err != nil {
		// crypto/rand does not fail on Go's platforms (it panics itself
		// since Go 1.24); a token without entropy must never be made.
		panic(fmt.Sprintf("tokenformat: crypto/rand: %v", err))
	}
	return Prefix + enc.EncodeToString(b[:])
}

// Parse checks that s is exactly a token: Prefix, then SecretBytes in
// canonical unpadded URL base64, nothing before or after. Its error never
// quotes s (a mistyped token is still most of a secret).
func Parse(s string) error {
	if len(s) != Len {
		return fmt.Errorf("%w: %d characters, want %d", ErrMalformed, len(s), Len)
	}
	body, ok := strings.CutPrefix(s, Prefix)
	if !ok {
		return fmt.Errorf("%w: does not start with %q", ErrMalformed, Prefix)
	}
	b, err := enc.DecodeString(body)
	if err != nil || len(b) != SecretBytes {
		return fmt.Errorf("%w: not %d bytes of unpadded URL base64 after %q", ErrMalformed, SecretBytes, Prefix)
	}
	return nil
}

// Hash is what the registry stores for token s: "sha256:" and the hex
// SHA-256 of s. No salt or slow KDF is needed: those protect secrets a
// person chose, which are few enough to guess. A token is 256 random
// bits, so the hash of a leaked etcd snapshot cannot be reversed or
// guessed, and checking a call costs one SHA-256 rather than a bcrypt on
// every request.
func Hash(s string) string {
	sum := sha256.Sum256([]byte(s))
	return "sha256:" + hex.EncodeToString(sum[:])
}
