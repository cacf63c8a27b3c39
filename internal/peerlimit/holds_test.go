package peerlimit_test

import (
	"errors"
	"testing"
	"time"

	"github.com/regcluster/registry/internal/peerlimit"
)

func capped(t *testing.T, n int) *peerlimit.Limiter {
	t.Helper()
	cfg := peerlimit.DefaultConfig()
	cfg.MaxRegistrations = n
	l, err := peerlimit.New(cfg)
	if err != nil {
		t.Fatal(err)
	}
	return l
}

func grant(t *testing.T, l *peerlimit.Limiter, key string, inst peerlimit.Instance, lease, rev int64) {
	t.Helper()
	r, err := l.Reserve(key, inst)
	if err != nil {
		t.Fatalf("reserve %s for %s: %v", inst, key, err)
	}
	r.Granted(lease, rev)
}

func wantCapped(t *testing.T, err error, key string) {
	t.Helper()
	var le *peerlimit.Error
	if !errors.As(err, &le) || le.Limit != peerlimit.Registrations || le.Peer != key || le.RetryAfter <= 0 {
		t.Fatalf("reserve past the cap: %v, want a registrations refusal of %s with a retry hint", err, key)
	}
}

// The cap counts holds per key; every way a registration ends gives its
// slot back, and only that registration's.
func TestRegistrationsHeld(t *testing.T) {
	l := capped(t, 3)
	a, b, c, d := peerlimit.Instance{Service: "s", ID: "a"}, peerlimit.Instance{Service: "s", ID: "b"},
		peerlimit.Instance{Service: "s", ID: "c"}, peerlimit.Instance{Service: "s", ID: "d"}
	grant(t, l, "k", a, 1, 10)
	grant(t, l, "k", b, 2, 11)
	grant(t, l, "k", c, 3, 12)
	_, err := l.Reserve("k", d)
	wantCapped(t, err, "k")
	if _, err := l.Reserve("other", d); err != nil {
		t.Fatalf("another key is capped by the first one's holds: %v", err)
	}
	// A re-Register of a held record moves its hold: allowed at the cap,
	// counted once.
	grant(t, l, "k", a, 4, 13)
	if n := l.Held("k"); n != 3 {
		t.Fatalf("held %d after a replace, want 3", n)
	}
	// A Deregister at an older revision than the hold (the hold is of a
	// newer registration) releases nothing; at a later one it does.
	l.Ended(a, 12)
	if n := l.Held("k"); n != 3 {
		t.Fatalf("held %d after a stale Ended", n)
	}
	l.Ended(a, 14)
	if n := l.Held("k"); n != 2 {
		t.Fatalf("held %d after Ended, want 2", n)
	}
	l.Ended(a, 15) // twice: nothing more
	// A lost lease releases only the hold under that lease.
	l.Lost(b, 99)
	if n := l.Held("k"); n != 2 {
		t.Fatalf("held %d after a Lost of another lease", n)
	}
	l.Lost(b, 2)
	if n := l.Held("k"); n != 1 {
		t.Fatalf("held %d after Lost, want 1", n)
	}
	// A cancelled Register gives its slot back, once.
	r, err := l.Reserve("k", d)
	if err != nil {
		t.Fatal(err)
	}
	r.Cancel()
	r.Cancel()
	r.Granted(5, 20) // after Cancel: nothing
	if n := l.Held("k"); n != 1 {
		t.Fatalf("held %d after a cancelled Register, want 1", n)
	}
}

// Sweep releases what the view shows ended, and leaves alone what the
// view has not reached yet.
func TestSweep(t *testing.T) {
	l := capped(t, 10)
	gone, moved, kept, fresh := peerlimit.Instance{Service: "s", ID: "gone"}, peerlimit.Instance{Service: "s", ID: "moved"},
		peerlimit.Instance{Service: "s", ID: "kept"}, peerlimit.Instance{Service: "s", ID: "fresh"}
	grant(t, l, "k", gone, 1, 10)
	grant(t, l, "k", moved, 2, 11)
	grant(t, l, "k", kept, 3, 12)
	grant(t, l, "k", fresh, 4, 50) // written after the view below
	view := map[peerlimit.Instance]int64{moved: 7, kept: 3}
	n := l.Sweep(40, func(i peerlimit.Instance) (int64, bool) { lease, ok := view[i]; return lease, ok })
	if n != 2 || l.Held("k") != 2 {
		t.Fatalf("swept %d, held %d; want the deleted and the replaced released, 2 left", n, l.Held("k"))
	}
	if n := l.Sweep(60, func(peerlimit.Instance) (int64, bool) { return 0, false }); n != 2 || l.Held("k") != 0 {
		t.Fatalf("a view with nothing: swept %d, held %d", n, l.Held("k"))
	}
}

// Sweep looks records up outside the limiter's lock (a lookup that calls
// the limiter does not deadlock), and a hold granted again while it looks
// is not released.
func TestSweepLooksUpOutsideTheLock(t *testing.T) {
	l := capped(t, 10)
	a, b := peerlimit.Instance{Service: "s", ID: "a"}, peerlimit.Instance{Service: "s", ID: "b"}
	grant(t, l, "k", a, 1, 10)
	grant(t, l, "k", b, 2, 11)
	done := make(chan int, 1)
	go func() {
		done <- l.Sweep(40, func(i peerlimit.Instance) (int64, bool) {
			if i == a {
				l.Held("k") // takes the limiter's lock
				// a registers again meanwhile
				if r, err := l.Reserve("k", a); err != nil {
					t.Error(err)
				} else {
					r.Granted(5, 41)
				}
			}
			return 0, false // neither is in the view
		})
	}()
	select {
	case n := <-done:
		if n != 1 || l.Held("k") != 1 {
			t.Fatalf("swept %d, held %d; want b released and a's new hold kept", n, l.Held("k"))
		}
	case <-time.After(10 * time.Second):
		t.Fatal("Sweep called lookup with the limiter's lock held: deadlock")
	}
}

// Two Registers of one record in flight at once hold one slot when both
// are granted, whichever is granted first.
func TestConcurrentReRegister(t *testing.T) {
	for _, newerFirst := range []bool{false, true} {
		l := capped(t, 5)
		inst := peerlimit.Instance{Service: "s", ID: "x"}
		r1, err1 := l.Reserve("k", inst)
		r2, err2 := l.Reserve("k", inst)
		if err := errors.Join(err1, err2); err != nil {
			t.Fatal(err)
		}
		if newerFirst {
			r2.Granted(2, 20)
			r1.Granted(1, 10)
		} else {
			r1.Granted(1, 10)
			r2.Granted(2, 20)
		}
		if n := l.Held("k"); n != 1 {
			t.Fatalf("newer first %v: held %d, want 1", newerFirst, n)
		}
		l.Lost(inst, 1) // the older lease: the hold is the newer one's
		if n := l.Held("k"); n != 1 {
			t.Fatalf("newer first %v: the older lease's loss released the newer hold", newerFirst)
		}
		l.Lost(inst, 2)
		if n := l.Held("k"); n != 0 {
			t.Fatalf("newer first %v: held %d after the loss", newerFirst, n)
		}
	}
}

// A record registered again by another key (the owner came back from
// another address) moves its slot to that key.
func TestHoldMovesToNewKey(t *testing.T) {
	l := capped(t, 1)
	inst := peerlimit.Instance{Service: "s", ID: "x"}
	grant(t, l, "old", inst, 1, 10)
	grant(t, l, "new", inst, 2, 11)
	if l.Held("old") != 0 || l.Held("new") != 1 {
		t.Fatalf("held old %d new %d, want 0 and 1", l.Held("old"), l.Held("new"))
	}
	if _, err := l.Reserve("old", peerlimit.Instance{Service: "s", ID: "y"}); err != nil {
		t.Fatalf("the old key's slot was not given back: %v", err)
	}
}

// The sweep of idle keys (every few thousand calls) never forgets a key
// that holds registrations: its count would be lost, and its release
// would find no bucket.
func TestIdleSweepKeepsHolders(t *testing.T) {
	l := capped(t, 1)
	inst := peerlimit.Instance{Service: "s", ID: "x"}
	grant(t, l, "k", inst, 1, 10)
	for range 10000 {
		_ = l.Write("busy")
	}
	if n := l.Held("k"); n != 1 {
		t.Fatalf("held %d after the idle sweep, want 1", n)
	}
	if _, err := l.Reserve("k", peerlimit.Instance{Service: "s", ID: "y"}); err == nil {
		t.Fatal("the idle sweep reset the count of a key at its cap")
	}
	l.Lost(inst, 1)
	if n := l.Held("k"); n != 0 {
		t.Fatalf("held %d after the loss", n)
	}
}
