package secret_test

import (
	"encoding/base64"
	"errors"
	"strings"
	"testing"

	"github.com/regcluster/registry/internal/secret"
)

func TestNewIsValidAndUnique(t *testing.T) {
	seen := map[string]bool{}
	for range 100 {
		s := secret.New()
		if err := secret.Valid(s); err != nil {
			t.Fatalf("New() = %q: %v", s, err)
		}
		if seen[s] {
			t.Fatalf("New() repeated %q", s)
		}
		seen[s] = true
	}
}

func TestValidRefusesWithoutQuoting(t *testing.T) {
	short := base64.RawURLEncoding.EncodeToString(make([]byte, 16))
	for _, s := range []string{"", "not base64!", short, strings.Repeat("A", 44)} {
		err := secret.Valid(s)
		if !errors.Is(err, secret.ErrMalformed) {
			t.Errorf("Valid(%q) = %v, want ErrMalformed", s, err)
		}
		if s != "" && err != nil && strings.Contains(err.Error(), s) {
			t.Errorf("Valid's error %q quotes the value", err)
		}
	}
}

func TestMatches(t *testing.T) {
	a, b := secret.New(), secret.New()
	h := secret.Hash(a)
	if strings.Contains(h, a) {
		t.Fatal("the hash contains the secret")
	}
	if !secret.Matches(a, h) {
		t.Fatal("a secret does not match its own hash")
	}
	if secret.Matches(b, h) || secret.Matches("", h) {
		t.Fatal("another or no secret matches")
	}
	// A value an older registry kept (a plain incarnation) matches nothing,
	// not even itself.
	if secret.Matches("inc-1", "inc-1") || secret.Matches(a, strings.TrimPrefix(h, "sha256:")) {
		t.Fatal("an unprefixed stored value matches")
	}
}
