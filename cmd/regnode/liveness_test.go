package main_test

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/regcluster/registry/client"
	"github.com/regcluster/registry/internal/etcdtest"
	registryv1 "github.com/regcluster/registry/proto/registry/v1"
)

// transitions is the ordered record of what a subscription went through:
// its connection changes (with the error that ended a connection) and the
// instances its changes brought. Both callbacks run on the subscription's
// goroutine, so the order is the subscription's own.
type transitions struct {
	mu  sync.Mutex
	log []string
}

func (tr *transitions) add(s string) {
	tr.mu.Lock()
	defer tr.mu.Unlock()
	tr.log = append(tr.log, s)
}

func (tr *transitions) snapshot() []string {
	tr.mu.Lock()
	defer tr.mu.Unlock()
	return append([]string(nil), tr.log...)
}

// index is the position of the first entry at or after from that has
// prefix, or -1.
func index(log []string, from int, prefix string) int {
	for i := from; i < len(log); i++ {
		if strings.HasPrefix(log[i], prefix) {
			return i
		}
	}
	return -1
}

// The regnode a subscriber is attached to is paused (SIGSTOP: its TCP
// connections stay up, it answers nothing). Within the receive deadline
// the subscriber gives up on it (Connected false, because of a stall, not
// a transport error: keepalive would take 13s), resumes on the other
// regnode, and a change made through that one reaches it. Shown on the
// Client's Subscribe stream (the SDK's default) and on a Watch stream per
// subscription (Config.WatchPerSubscription).
func TestPausedRegnodeSubscriberMovesOn(t *testing.T) {
	for _, tc := range []struct {
		name  string
		watch bool
	}{{"subscribe", false}, {"watch", true}} {
		t.Run(tc.name, func(t *testing.T) { pausedRegnodeSubscriberMovesOn(t, tc.watch) })
	}
}

func pausedRegnodeSubscriberMovesOn(t *testing.T, watch bool) {
	m := etcdtest.Start(t, false)
	rs := cluster(t, m.ClientURL, 2, "2s")
	c, err := client.New(client.Config{Endpoints: []string{rs[0].api, rs[1].api}, WatchPerSubscription: watch})
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()

	tr := &transitions{}
	sub, err := c.Subscribe(context.Background(), "orders", client.SubscribeOptions{
		OnConnection: func(f client.Freshness) {
			if f.Connected {
				tr.add("connected")
				return
			}
			// f.Err: why, as it was then (the callback runs behind the stream).
			tr.add(fmt.Sprintf("disconnected stalled=%t: %v", errors.Is(f.Err, client.ErrStalled), f.Err))
		},
		OnChange: func(ch client.Change) {
			for _, in := range append(append([]*registryv1.Instance(nil), ch.Added...), ch.Instances...) {
				tr.add(fmt.Sprintf("instance %s rev %d", in.Id, ch.Revision))
			}
		},
	})
	if err != nil {
		t.Fatal(err)
	}
	defer sub.Close()
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	if err := sub.WaitReady(ctx); err != nil {
		t.Fatal(err)
	}

	// Which regnode serves the subscription: the one counting a subscriber.
	var attached, other *regnodeProc
	for attached == nil && ctx.Err() == nil {
		for i, r := range rs {
			if metric(t, r, `registry_subscribers`) == 1 {
				attached, other = r, rs[1-i]
			}
		}
		time.Sleep(20 * time.Millisecond)
	}
	if attached == nil {
		t.Fatal("no regnode reports the subscriber")
	}
	if err := attached.p.cmd.Process.Signal(syscall.SIGSTOP); err != nil {
		t.Fatal(err)
	}
	defer attached.p.cmd.Process.Signal(syscall.SIGCONT)
	pausedAt, paused := time.Now(), len(tr.snapshot())

	oc, err := client.New(client.Config{Endpoints: []string{other.api}})
	if err != nil {
		t.Fatal(err)
	}
	defer oc.Close()
	reg, err := oc.API().Register(ctx, &registryv1.RegisterRequest{
		Instance: &registryv1.Instance{Service: "orders", Id: "o-after-pause", Address: "10.0.0.9:80"},
		Ttl:      durationpbS(60)})
	if err != nil {
		t.Fatalf("register through %s: %v", other.name, err)
	}

	// Bounded by ctx (30s in all, for a 3s deadline); asserted by what
	// the subscription went through, in its order.
	for {
		log := tr.snapshot()
		down := index(log, paused, "disconnected")
		up := -1
		if down >= 0 {
			up = index(log, down, "connected")
		}
		seen := index(log, paused, "instance o-after-pause")
		if seen >= 0 {
			switch {
			case down < 0 || down > seen:
				t.Fatalf("the change reached the subscriber without a disconnection first: %q", log[paused:])
			case !strings.HasPrefix(log[down], "disconnected stalled=true"):
				t.Fatalf("the subscription left the paused regnode for another reason than its receive deadline: %q", log[down])
			case up < 0 || up > seen:
				t.Fatalf("the change arrived before the subscription was connected again: %q", log[paused:])
			}
			if got := sub.Revision(); got < reg.Revision {
				t.Fatalf("subscriber at revision %d, registered at %d", got, reg.Revision)
			}
			if f := sub.Freshness(); !f.Connected {
				t.Fatalf("subscriber not connected after catching up: %+v", f)
			}
			// Reported, not asserted: the order above is the contract.
			t.Logf("after the pause: %q; the change was seen %s after SIGSTOP", log[paused:], time.Since(pausedAt).Round(10*time.Millisecond))
			return
		}
		select {
		case <-ctx.Done():
			t.Fatalf("the change made through %s never reached the subscriber of paused %s: %q", other.name, attached.name, log[paused:])
		case <-time.After(20 * time.Millisecond):
		}
	}
}

// Several subscriptions of one Client stall together when their regnode is
// paused, and resume at the same moment: each moves to the other regnode
// at its first attempt (the Client's picker steers a resuming stream off
// the regnode that stalled it), instead of landing on the paused one again
// whenever another subscription's pick came in between.
func TestPausedRegnodeEverySubscriptionMovesOnce(t *testing.T) {
	m := etcdtest.Start(t, false)
	rs := cluster(t, m.ClientURL, 2, "2s")
	c, err := client.New(client.Config{Endpoints: []string{rs[0].api, rs[1].api}})
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	const n = 8
	var subs []*client.Subscription
	for i := range n {
		sub, err := c.Subscribe(context.Background(), fmt.Sprintf("svc-%d", i), client.SubscribeOptions{})
		if err != nil {
			t.Fatal(err)
		}
		defer sub.Close()
		if err := sub.WaitReady(ctx); err != nil {
			t.Fatal(err)
		}
		subs = append(subs, sub)
	}
	// Pause the regnode holding the most subscriptions.
	counts := []int{metric(t, rs[0], `registry_subscribers`), metric(t, rs[1], `registry_subscribers`)}
	if counts[0]+counts[1] != n {
		t.Fatalf("subscribers %v, want %d in all", counts, n)
	}
	p, other := rs[0], rs[1]
	if counts[1] > counts[0] {
		p, other = rs[1], rs[0]
	}
	moving := max(counts[0], counts[1])
	if err := p.p.cmd.Process.Signal(syscall.SIGSTOP); err != nil {
		t.Fatal(err)
	}
	defer p.p.cmd.Process.Signal(syscall.SIGCONT)
	for metric(t, other, `registry_subscribers`) != n {
		if ctx.Err() != nil {
			t.Fatalf("%d of %d subscriptions on %s", metric(t, other, `registry_subscribers`), n, other.name)
		}
		time.Sleep(20 * time.Millisecond)
	}
	for _, sub := range subs {
		for !sub.Freshness().Connected {
			if ctx.Err() != nil {
				t.Fatalf("subscription of %s not connected again", sub.Service())
			}
			time.Sleep(20 * time.Millisecond)
		}
	}
	// Each stream that ended is one reconnect: a subscription that went
	// back to the paused regnode would count two.
	total := 0
	for _, sub := range subs {
		r := sub.Stats().Reconnects
		if r > 1 {
			t.Errorf("subscription of %s reconnected %d times, want at most once", sub.Service(), r)
		}
		total += r
	}
	if total != moving {
		t.Errorf("%d reconnects, want one for each of the %d subscriptions on the paused regnode", total, moving)
	}
}
