package main

import (
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/regcluster/registry/internal/netproxy"
	"github.com/regcluster/registry/internal/regnodetest"
	"github.com/regcluster/registry/internal/render"
)

// waitStderr waits until w's stderr holds want and returns where.
func waitStderr(t *testing.T, w *watchProc, want string) int {
	t.Helper()
	deadline := time.Now().Add(lineWait)
	for {
		if i := strings.Index(w.stderr.String(), want); i >= 0 {
			return i
		}
		if time.Now().After(deadline) {
			t.Fatalf("stderr %q after %s, want %q", w.stderr.String(), lineWait, want)
		}
		time.Sleep(20 * time.Millisecond)
	}
}

// The link to the only regnode goes silent (up, but nothing passes, as
// with a paused regnode or a half-open connection): watch warns that its
// view is no longer confirmed, then, once the link carries traffic again,
// says that the view is current, and goes on printing changes.
func TestWatchWarnsWhenUnconfirmed(t *testing.T) {
	rn := regnodetest.Start(t)
	px, err := netproxy.New("127.0.0.1:0", rn.Addr)
	if err != nil {
		t.Fatal(err)
	}
	defer px.Cut()
	w := &jsonWatch{watchProc: startWatch(t, "--endpoints", px.Addr(), "-o", "json", "watch")}
	if l := w.nextJSON(t); l.Type != render.WatchSnapshot {
		t.Fatalf("first line %+v, want a snapshot", l)
	}
	px.Pause()
	stale := waitStderr(t, w.watchProc, "regctl: warning: the view has not been confirmed by a regnode for more than 3s")
	px.Resume()
	current := waitStderr(t, w.watchProc, "regctl: watching again: the view is current at revision")
	if current < stale {
		t.Fatalf("stderr %q: current before the warning", w.stderr.String())
	}
	api := apiClient(t, rn.Addr)
	r := register(t, api, "orders", "o-1", "10.0.0.1:80")
	for {
		l := w.nextAny(t)
		if l.Type == render.WatchPut {
			wantPut(t, l, "o-1", "SERVING", r.Revision)
			break
		}
	}
	w.stop(t, syscall.SIGTERM)
	if n := strings.Count(w.stderr.String(), "\n"); n != 2 {
		t.Errorf("stderr %q, want the warning and the line saying it is current", w.stderr.String())
	}
}
