package peerlimit

import (
	"context"
	"errors"
	"testing"
	"time"
)

func waitUntil(t *testing.T, what string, cond func() bool) {
	t.Helper()
	deadline := time.Now().Add(10 * time.Second)
	for !cond() {
		if time.Now().After(deadline) {
			t.Fatalf("timed out waiting for %s", what)
		}
		time.Sleep(time.Millisecond)
	}
}

// A key's writes past MaxWritesInFlight wait, in order, and each end lets
// exactly one more through; another key is not held up; a waiter whose
// context ends leaves without taking a place.
func TestWritesInFlight(t *testing.T) {
	cfg := DefaultConfig()
	cfg.MaxWritesInFlight = 2
	l, err := New(cfg)
	if err != nil {
		t.Fatal(err)
	}
	ctx := context.Background()
	cancelled, cancel := context.WithCancel(ctx)
	cancel()
	d1, err1 := l.EnterWrite(ctx, "k")
	d2, err2 := l.EnterWrite(ctx, "k")
	if err := errors.Join(err1, err2); err != nil {
		t.Fatal(err)
	}
	if _, err := l.EnterWrite(cancelled, "k"); !errors.Is(err, context.Canceled) {
		t.Fatalf("a third write of a key capped at 2 in flight did not wait: %v", err)
	}
	if l.Waiting("k") != 0 {
		t.Fatal("a waiter whose context ended is still queued")
	}
	other, err := l.EnterWrite(cancelled, "other")
	if err != nil {
		t.Fatalf("another key's write waited: %v", err)
	}
	other()

	order := make(chan int, 2)
	dones := make(chan func(), 2)
	for i := range 2 {
		go func() {
			d, err := l.EnterWrite(ctx, "k")
			if err != nil {
				t.Error(err)
				return
			}
			order <- i
			dones <- d
		}()
		waitUntil(t, "the waiter to queue", func() bool { return l.Waiting("k") == i+1 })
	}
	d1()
	d1() // once: lets one through, not two
	if got := <-order; got != 0 {
		t.Fatalf("waiter %d went first", got)
	}
	if l.Waiting("k") != 1 {
		t.Fatalf("%d waiting after one write ended, want 1", l.Waiting("k"))
	}
	d2()
	if got := <-order; got != 1 {
		t.Fatalf("waiter %d went second", got)
	}
	(<-dones)()
	(<-dones)()
	if d, err := l.EnterWrite(cancelled, "k"); err != nil {
		t.Fatalf("a write after every one ended waited: %v", err)
	} else {
		d()
	}
	l.mu.Lock()
	running := l.mu.peers["k"].writes.running
	l.mu.Unlock()
	if running != 0 {
		t.Fatalf("%d writes counted running after all ended", running)
	}
}

// The sweep of idle keys never forgets a key with writes in flight: its
// next write would not wait for them.
func TestIdleSweepKeepsWriters(t *testing.T) {
	cfg := DefaultConfig()
	cfg.MaxWritesInFlight = 1
	l, err := New(cfg)
	if err != nil {
		t.Fatal(err)
	}
	done, err := l.EnterWrite(context.Background(), "k")
	if err != nil {
		t.Fatal(err)
	}
	defer done()
	for range 10000 {
		_ = l.Write("busy")
	}
	cancelled, cancel := context.WithCancel(context.Background())
	cancel()
	if _, err := l.EnterWrite(cancelled, "k"); !errors.Is(err, context.Canceled) {
		t.Fatalf("after the idle sweep a second write of a key capped at 1 did not wait: %v", err)
	}
}
