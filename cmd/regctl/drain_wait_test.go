package main

import (
	"context"
	"fmt"
	"strings"
	"syscall"
	"testing"
	"time"

	"google.golang.org/protobuf/types/known/durationpb"

	"github.com/regcluster/registry/client"
	"github.com/regcluster/registry/internal/etcdtest"
	"github.com/regcluster/registry/internal/regnodetest"
	"github.com/regcluster/registry/internal/render"
	registryv1 "github.com/regcluster/registry/proto/registry/v1"
)

// drain --wait over three regnodes and thirty subscribers, one of them a
// regctl watch process that is SIGSTOPped: the wait names it (its pid, its
// regnode) and ends at the timeout with exit 1; resumed, it catches up and
// the next drain --wait completes.
func TestDrainWaitNamesAStoppedSubscriber(t *testing.T) {
	m := etcdtest.Start(t, false)
	rns := []*regnodetest.Regnode{regnodetest.StartExternal(t, m.ClientURL), regnodetest.StartExternal(t, m.ClientURL),
		regnodetest.StartExternal(t, m.ClientURL)}
	api := apiClient(t, rns[0].Addr)
	register(t, api, "orders", "o-1", "10.0.0.1:80")
	last := register(t, api, "orders", "o-2", "10.0.0.2:80").Revision
	ctx, cancel := context.WithTimeout(context.Background(), 3*time.Minute)
	defer cancel()

	// 29 subscribers in this process, one Client each, over the three
	// regnodes (10, 10 and 9), and the 30th a process on the third.
	const inProcess = 29
	for i := range inProcess {
		c, err := client.New(client.Config{Endpoints: []string{rns[i%3].Addr}, Subscriber: fmt.Sprintf("in-process-%d", i)})
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { c.Close() })
		s, err := c.Subscribe(ctx, "orders", client.SubscribeOptions{})
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(s.Close)
		if err := s.WaitReady(ctx); err != nil {
			t.Fatal(err)
		}
	}
	w := &jsonWatch{watchProc: startWatch(t, "--endpoints", rns[2].Addr, "-o", "json", "watch", "orders")}
	if l := w.nextJSON(t); l.Type != render.WatchSnapshot || len(l.Instances) != 2 {
		t.Fatalf("first line %+v, want the snapshot of both", l)
	}
	pid := w.cmd.Process.Pid
	// counted waits until every regnode counts all 30, all at rev.
	counted := func(rev int64) {
		t.Helper()
		for {
			r, err := api.WaitApplied(ctx, &registryv1.WaitAppliedRequest{Service: "orders", Revision: rev, Timeout: durationpb.New(0)})
			if err != nil {
				t.Fatal(err)
			}
			if r.Done && r.Subscribers == inProcess+1 {
				return
			}
			if ctx.Err() != nil {
				t.Fatalf("the regnodes never counted all %d subscribers at %d: %v", inProcess+1, rev, r)
			}
			time.Sleep(50 * time.Millisecond)
		}
	}
	counted(last)

	if err := syscall.Kill(pid, syscall.SIGSTOP); err != nil {
		t.Fatal(err)
	}
	stopped := true
	defer func() {
		if stopped {
			_ = syscall.Kill(pid, syscall.SIGCONT)
		}
	}()
	r := regctl(t, nil, "--endpoints", rns[0].Addr, "--timeout", "3s", "drain", "orders/o-1", "--wait")
	if r.code != 1 || !strings.Contains(r.stdout, "orders/o-1 DRAINING") {
		t.Fatalf("drain --wait with a stopped subscriber: want the drain printed and exit 1; %v", r)
	}
	for _, want := range []string{
		"1 of 30 live subscribers of orders have not applied revision",
		"after 3s",
		fmt.Sprintf("regnode %s (%s): 1 of 10: ", rns[2].Node.Name(), rns[2].Addr),
		fmt.Sprintf("/%d (", pid),
	} {
		if !strings.Contains(r.stderr, want) {
			t.Errorf("stderr lacks %q; %v", want, r)
		}
	}
	if strings.Contains(r.stderr, "in-process-") {
		t.Errorf("stderr names a subscriber that applied the drain; %v", r)
	}
	var drainRev int64
	if _, err := fmt.Sscanf(r.stdout[strings.Index(r.stdout, "(revision "):], "(revision %d)", &drainRev); err != nil {
		t.Fatalf("no revision in %q: %v", r.stdout, err)
	}

	if err := syscall.Kill(pid, syscall.SIGCONT); err != nil {
		t.Fatal(err)
	}
	stopped = false
	for {
		l := w.nextJSON(t)
		if l.Type == render.WatchPut && l.Instance.ID == "o-1" && l.Instance.Lifecycle == "DRAINING" {
			break
		}
	}
	counted(drainRev) // it acknowledged the drain it missed: all 30 again
	r = mustOK(t, regctl(t, nil, "--endpoints", rns[0].Addr, "--timeout", "30s", "drain", "orders/o-2", "--wait"))
	if !strings.Contains(r.stdout, "orders/o-2 DRAINING") || !strings.Contains(r.stdout, "applied by all 30 live subscribers on 3 regnodes") {
		t.Fatalf("drain --wait with every subscriber running: %v", r)
	}
	w.stop(t, syscall.SIGTERM)
}
