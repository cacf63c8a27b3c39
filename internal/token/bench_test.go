package token_test

import (
	"context"
	"fmt"
	"testing"

	"github.com/regcluster/registry/internal/etcdtest"
	"github.com/regcluster/registry/internal/token"
)

// BenchmarkCheck is the cost the token check adds to every call: parse,
// one SHA-256, a map lookup under a read lock and the role table, with
// 1,000 tokens cached.
func BenchmarkCheck(b *testing.B) {
	cli := etcdtest.Start(b, false).Client(b)
	var tok string
	for i := range 1000 {
		_, t, _, err := token.Create(context.Background(), cli, prefix, fmt.Sprintf("t-%d", i), token.Register,
			token.Scope{Kind: token.ScopePrefix, Value: "web"}, 0, "bench")
		if err != nil {
			b.Fatal(err)
		}
		tok = t
	}
	c, err := token.NewCache(token.Config{Client: cli, Prefix: prefix})
	if err != nil {
		b.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan struct{})
	go func() { defer close(done); _ = c.Run(ctx) }()
	defer func() { cancel(); <-done }()
	<-c.Ready()
	b.ReportAllocs()
	b.ResetTimer()
	for b.Loop() {
		if _, err := c.Check(tok, token.RegisterCall, "web-1"); err != nil {
			b.Fatal(err)
		}
	}
}
