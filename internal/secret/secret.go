// Package secret makes and checks registration secrets: 32 random bytes,
// base64 (URL alphabet, unpadded), held only by the registering handle.
// The registry stores only Hash of a secret, so nothing it returns or
// keeps lets anyone act as the owner.
package secret

import (
	"crypto/rand"
	"crypto/sha256"
	"crypto/subtle"
	"encoding/base64"
	"encoding/hex"
	"errors"
	"fmt"
	"strings"
)

// Size is the number of random bytes in a secret.
const Size = 32

// hashPrefix marks a stored hash, so a value written by an older registry
// (a plain incarnation) never matches any secret.
const hashPrefix = "sha256:"

// ErrMalformed is wrapped by Parse for a value that is not a secret.
var ErrMalformed = errors.New("not a registration secret")

var enc = base64.RawURLEncoding

// New returns a fresh secret from crypto/rand.
func New() string {
	var b [Size]byte
	if _, err := rand.Read(b[:]); err != nil {
		// crypto/rand never fails on the platforms Go supports (it
		// panics itself since Go 1.24); a secret without entropy must
		// never be handed out.
		panic(fmt.Sprintf("secret: crypto/rand: %v", err))
	}
	return enc.EncodeToString(b[:])
}

// Valid reports whether s is a well-formed secret (Size bytes, base64).
// Its error never quotes s.
func Valid(s string) error {
	b, err := enc.DecodeString(s)
	if err != nil {
		return fmt.Errorf("%w: not unpadded URL base64 (%d characters)", ErrMalformed, len(s))
	}
	if len(b) != Size {
		return fmt.Errorf("%w: %d bytes, want %d", ErrMalformed, len(b), Size)
	}
	return nil
}

// Hash is what the registry stores for secret s: "sha256:" and the hex
// SHA-256 of s. A secret has 256 bits of entropy, so a plain hash (no
// salt, no stretching) cannot be reversed or guessed.
func Hash(s string) string {
	sum := sha256.Sum256([]byte(s))
	return hashPrefix + hex.EncodeToString(sum[:])
}

// Matches reports whether s is the secret whose hash is stored, in
// constant time. An empty or foreign stored value matches nothing.
func Matches(s, stored string) bool {
	if s == "" || !strings.HasPrefix(stored, hashPrefix) {
		return false
	}
	return subtle.ConstantTimeCompare([]byte(Hash(s)), []byte(stored)) == 1
}
