package client_test

import (
	"context"
	"errors"
	"strings"
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
	sub, err := c.Subscribe(context.Background(), "orders", client.SubscribeOptions{ReceiveDeadline: time.Hour,
		OnConnection: func(f client.Freshness) {
			if !f.Connected {
				select {
				case down <- f.Err: // why, as it was then: the callback runs behind the stream
				default:
				}
			}
		}})
	if err != nil {
		t.Fatal(err)
	}
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

// An idle registry keeps a subscription connected: regnode's heartbeats
// (progress, at least once a second) reach it well within its receive
// deadline, so it never gives up on a healthy regnode. Judged over more
// heartbeats than fit in one deadline.
func TestIdleSubscriptionStaysConnected(t *testing.T) {
	rn := regnodetest.Start(t)
	c := newClient(t, rn.Addr)
	beats := make(chan struct{}, 64)
	sub, err := c.Subscribe(context.Background(), "orders", client.SubscribeOptions{ReceiveDeadline: client.MinReceiveDeadline,
		OnChange: func(ch client.Change) {
			if ch.Progress {
				select {
				case beats <- struct{}{}:
				default:
				}
			}
		}})
	if err != nil {
		t.Fatal(err)
	}
	defer sub.Close()
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	if err := sub.WaitReady(ctx); err != nil {
		t.Fatal(err)
	}
	first := time.Now()
	for n := 0; n < 8 || time.Since(first) < 2*client.MinReceiveDeadline; n++ {
		select {
		case <-beats:
		case <-ctx.Done():
			t.Fatalf("%d heartbeats, then none (stats %+v)", n, sub.Stats())
		}
	}
	if st := sub.Stats(); st.Reconnects != 0 {
		t.Fatalf("an idle subscription reconnected %d times (last error %v)", st.Reconnects, sub.LastError())
	}
	if !sub.Freshness().Connected {
		t.Fatal("an idle subscription is not connected")
	}
}
