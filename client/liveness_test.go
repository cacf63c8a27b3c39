package client_test

import (
	"context"
	"errors"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/regcluster/registry/client"
	"github.com/regcluster/registry/internal/etcdtest"
	"github.com/regcluster/registry/internal/regnodetest"
	"github.com/regcluster/registry/record"
)

// A receive deadline a quiet, healthy regnode would break (shorter than
// two progress intervals) is refused, naming the field; nothing starts.
func TestReceiveDeadlineValidated(t *testing.T) {
	c := newClient(t, "127.0.0.1:1")
	for _, d := range []time.Duration{-time.Second, time.Millisecond, client.MinReceiveDeadline - 1} {
		sub, err := c.Subscribe(context.Background(), "orders", client.SubscribeOptions{ReceiveDeadline: d})
		if err == nil {
			sub.Close()
			t.Fatalf("ReceiveDeadline %s accepted", d)
		}
		if !errors.Is(err, record.ErrInvalid) || !strings.Contains(err.Error(), "ReceiveDeadline") {
			t.Fatalf("ReceiveDeadline %s: %v, want an invalid-field error naming it", d, err)
		}
	}
	sub, err := c.Subscribe(context.Background(), "orders", client.SubscribeOptions{ReceiveDeadline: client.MinReceiveDeadline})
	if err != nil {
		t.Fatalf("ReceiveDeadline %s refused: %v", client.MinReceiveDeadline, err)
	}
	sub.Close()
}

// With a receive deadline too long to matter, a link gone silent is still
// noticed: the SDK's keepalive pings go unanswered and the connection is
// dropped, which ends the stream (Connected false, a keepalive error).
func TestKeepaliveEndsASilentStream(t *testing.T) {
	t.Parallel()
	rn := regnodetest.Start(t)
	px := etcdtest.NewProxy(t, rn.Addr)
	c := newClient(t, px.Addr())
	down := make(chan error, 1)
	var subp atomic.Pointer[client.Subscription]
	sub, err := c.Subscribe(context.Background(), "orders", client.SubscribeOptions{ReceiveDeadline: time.Hour,
		OnConnection: func(f client.Freshness) {
			if s := subp.Load(); s != nil && !f.Connected {
				select {
				case down <- s.LastError():
				default:
				}
			}
		}})
	if err != nil {
		t.Fatal(err)
	}
	subp.Store(sub)
	defer sub.Close()
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	if err := sub.WaitReady(ctx); err != nil {
		t.Fatal(err)
	}
	px.Pause()
	defer px.Resume()
	select {
	case err := <-down:
		if err == nil || !strings.Contains(err.Error(), "keepalive") {
			t.Fatalf("the stream ended with %v, want a keepalive failure", err)
		}
	case <-ctx.Done():
		t.Fatal("the silent stream never ended")
	}
}
