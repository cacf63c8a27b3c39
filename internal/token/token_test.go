package token_test

import (
	"context"
	"strings"
	"testing"

	"google.golang.org/grpc/metadata"

	"github.com/regcluster/registry/internal/token"
)

func TestNewParses(t *testing.T) {
	a, b := token.New(), token.New()
	if a == b {
		t.Fatal("two tokens are equal")
	}
	for _, tok := range []string{a, b} {
		if err := token.Parse(tok); err != nil {
			t.Fatalf("Parse(New()) = %v", err)
		}
		if len(tok) != token.Len || !strings.HasPrefix(tok, token.Prefix) {
			t.Fatalf("token of %d characters, prefix %q", len(tok), tok[:len(token.Prefix)])
		}
	}
	if token.Hash(a) == token.Hash(b) || !strings.HasPrefix(token.Hash(a), "sha256:") {
		t.Fatalf("hashes %s %s", token.Hash(a), token.Hash(b))
	}
}

// Parse accepts exactly Prefix + 43 characters of canonical unpadded URL
// base64, and its error never quotes what it was given.
func TestParseStrict(t *testing.T) {
	good := token.New()
	body := strings.TrimPrefix(good, token.Prefix)
	// The last character of 32 bytes in base64 carries 2 padding bits:
	// 'A' has them zero, 'B' does not (non-canonical, refused by Strict).
	canonical := token.Prefix + body[:len(body)-1] + "A"
	nonCanonical := token.Prefix + body[:len(body)-1] + "B"
	for _, tc := range []struct {
		name, in string
		ok       bool
	}{
		{"new", good, true},
		{"canonical", canonical, true},
		{"empty", "", false},
		{"prefix only", token.Prefix, false},
		{"no prefix", body + "1234567", false},
		{"other prefix", "regtoK_" + body, false},
		{"trailing newline", good[1:] + "\n", false},
		{"leading space", " " + good[1:], false},
		{"padding", token.Prefix + body[:len(body)-1] + "=", false},
		{"std alphabet", token.Prefix + strings.Repeat("+", len(body)), false},
		{"non canonical", nonCanonical, false},
		{"one longer", good + "A", false},
		{"one shorter", good[:len(good)-1], false},
		{"registration secret", body, false},
	} {
		err := token.Parse(tc.in)
		if (err == nil) != tc.ok {
			t.Errorf("%s: Parse = %v, want ok=%v", tc.name, err, tc.ok)
		}
		if err != nil && len(tc.in) > 8 && strings.Contains(err.Error(), tc.in[len(token.Prefix):]) {
			t.Errorf("%s: the error quotes the input: %v", tc.name, err)
		}
	}
}

func TestFromIncoming(t *testing.T) {
	tok := token.New()
	for _, tc := range []struct {
		name string
		md   metadata.MD
		want string
		bad  bool
	}{
		{"none", nil, "", false},
		{"bearer", metadata.Pairs("authorization", "Bearer "+tok), tok, false},
		{"scheme case", metadata.Pairs("authorization", "bEaReR "+tok), tok, false},
		{"two values", metadata.Pairs("authorization", "Bearer "+tok, "authorization", "Bearer "+tok), "", true},
		{"basic", metadata.Pairs("authorization", "Basic "+tok), "", true},
		{"no scheme", metadata.Pairs("authorization", tok), "", true},
		{"two spaces", metadata.Pairs("authorization", "Bearer  "+tok), "", true},
		{"empty", metadata.Pairs("authorization", ""), "", true},
		{"not a token", metadata.Pairs("authorization", "Bearer hunter2"), "", true},
	} {
		ctx := metadata.NewIncomingContext(context.Background(), tc.md)
		got, err := token.FromIncoming(ctx)
		if (err != nil) != tc.bad || got != tc.want {
			t.Errorf("%s: FromIncoming = %q, %v; want %q, error %v", tc.name, got, err, tc.want, tc.bad)
		}
		if err != nil && strings.Contains(err.Error(), tok[len(token.Prefix):]) {
			t.Errorf("%s: the error quotes the token: %v", tc.name, err)
		}
	}
}
