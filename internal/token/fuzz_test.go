package token_test

import (
	"context"
	"strings"
	"testing"
	"unicode"

	"google.golang.org/grpc/metadata"

	"github.com/regcluster/registry/internal/token"
)

// digitless is msg without its digits: the shape of a message, so that a
// test can tell a fixed message from one quoting its input.
func digitless(msg string) string {
	return strings.Map(func(r rune) rune {
		if unicode.IsDigit(r) {
			return -1
		}
		return r
	}, msg)
}

// The only messages Parse and FromIncoming say, without their numbers:
// none quotes the input.
var shapes = map[string]bool{
	"not a registry token:  characters, want ":                              true,
	`not a registry token: does not start with "regtok_"`:                   true,
	`not a registry token: not  bytes of unpadded URL base after "regtok_"`: true,
	`malformed authorization metadata: want "Bearer <token>"`:               true,
	"malformed authorization metadata:  authorization values, want one":     true,
}

// FuzzParse: Parse never panics; what it accepts is a token of the right
// length and prefix that hashes the same every time; what it refuses it
// says in one of a few fixed messages.
func FuzzParse(f *testing.F) {
	f.Add(token.New())
	f.Add("")
	f.Add(token.Prefix)
	f.Add("regtok_AAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAB")
	f.Fuzz(func(t *testing.T, s string) {
		err := token.Parse(s)
		if err == nil {
			if len(s) != token.Len || !strings.HasPrefix(s, token.Prefix) || token.Hash(s) != token.Hash(s) {
				t.Fatalf("accepted %q", s)
			}
			return
		}
		if !shapes[digitless(err.Error())] {
			t.Fatalf("Parse(%q): unexpected message %q", s, err)
		}
	})
}

// FuzzFromIncoming: the interceptor's reading of "authorization"
// metadata never panics, returns a token only when the one value is
// "Bearer " and a token, and refuses everything else in a fixed message.
func FuzzFromIncoming(f *testing.F) {
	f.Add("Bearer "+token.New(), 1)
	f.Add("bearer "+token.New(), 2)
	f.Add("Basic dXNlcjpwYXNz", 1)
	f.Add("Bearer ", 1)
	f.Add("", 0)
	f.Fuzz(func(t *testing.T, value string, n int) {
		n = max(0, n%4)
		var kv []string
		for range n {
			kv = append(kv, "authorization", value)
		}
		ctx := metadata.NewIncomingContext(context.Background(), metadata.Pairs(kv...))
		tok, err := token.FromIncoming(ctx)
		switch {
		case err != nil:
			if tok != "" || !shapes[digitless(err.Error())] {
				t.Fatalf("%d x %q: %q, unexpected message %q", n, value, tok, err)
			}
		case n == 0:
			if tok != "" {
				t.Fatalf("no metadata gave %q", tok)
			}
		default:
			if n != 1 || token.Parse(tok) != nil || !strings.EqualFold(value[:7], "bearer ") || value[7:] != tok {
				t.Fatalf("%d x %q gave %q", n, value, tok)
			}
		}
	})
}
