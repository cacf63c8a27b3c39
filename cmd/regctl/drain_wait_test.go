package main

import (
	"context"
	"fmt"
	"net"
	"os"
	"os/exec"
	"strings"
	"syscall"
	"testing"
	"time"

	clientv3 "go.etcd.io/etcd/client/v3"
	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials/insecure"
	"google.golang.org/protobuf/types/known/durationpb"

	"github.com/regcluster/registry/client"
	"github.com/regcluster/registry/internal/etcdtest"
	"github.com/regcluster/registry/internal/regnodetest"
	"github.com/regcluster/registry/internal/render"
	registryv1 "github.com/regcluster/registry/proto/registry/v1"
	"github.com/regcluster/registry/record"
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

// watchChildEnv, set to a regnode's API address, makes the test binary a
// Watch client of service orders there (watchChild) instead of the tests.
const watchChildEnv = "REGCTL_TEST_WATCH_CHILD"

// watchChild is a raw Watch stream of orders at addr, what an older SDK or
// the SDK with Config.WatchPerSubscription opens: it prints the address it
// dials from ("local ADDR"), then "rev N" for every message. Its HTTP/2
// windows are fixed at their 64 KiB minimum (which turns grpc-go's BDP
// growth off), so that once it stops reading (SIGSTOP) the regnode can
// hand its transport only about that much plus its write quota.
func watchChild(addr string) int {
	cc, err := grpc.NewClient(addr, grpc.WithTransportCredentials(insecure.NewCredentials()),
		grpc.WithInitialWindowSize(64<<10), grpc.WithInitialConnWindowSize(64<<10),
		grpc.WithContextDialer(func(ctx context.Context, a string) (net.Conn, error) {
			c, err := (&net.Dialer{}).DialContext(ctx, "tcp", a)
			if err == nil {
				fmt.Printf("local %s\n", c.LocalAddr())
			}
			return c, err
		}))
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		return 1
	}
	defer cc.Close()
	st, err := registryv1.NewRegistryClient(cc).Watch(context.Background(),
		&registryv1.WatchRequest{Service: "orders", Subscriber: fmt.Sprintf("watch-child/%d", os.Getpid())})
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		return 1
	}
	for {
		m, err := st.Recv()
		if err != nil {
			fmt.Fprintln(os.Stderr, err)
			return 1
		}
		fmt.Printf("rev %d\n", m.Revision)
	}
}

// drain --wait counts Watch streams, which cannot acknowledge, apart from
// the subscribers that do: one whose process is SIGSTOPped (the regnode's
// sends to it block on flow control) holds the wait, which names it (its
// pid, its address, its regnode) and ends at the timeout with exit 1;
// resumed, it reads the drain, and the next drain --wait completes.
func TestDrainWaitNamesAStoppedWatchStream(t *testing.T) {
	m := etcdtest.Start(t, false)
	rns := []*regnodetest.Regnode{regnodetest.StartExternal(t, m.ClientURL), regnodetest.StartExternal(t, m.ClientURL)}
	api := apiClient(t, rns[0].Addr)
	register(t, api, "orders", "o-1", "10.0.0.1:80")
	last := register(t, api, "orders", "o-2", "10.0.0.2:80").Revision
	ctx, cancel := context.WithTimeout(context.Background(), 3*time.Minute)
	defer cancel()

	// One acknowledging subscriber, on the regnode asked.
	c, err := client.New(client.Config{Endpoints: []string{rns[0].Addr}, Subscriber: "sdk"})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { c.Close() })
	sub, err := c.Subscribe(ctx, "orders", client.SubscribeOptions{})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(sub.Close)
	if err := sub.WaitReady(ctx); err != nil {
		t.Fatal(err)
	}
	// One Watch stream, a process of its own, on the other regnode.
	cmd := exec.Command(os.Args[0])
	cmd.Env = environ(watchChildEnv + "=" + rns[1].Addr)
	childErr := &syncBuffer{}
	cmd.Stderr = childErr
	lines := readLines(t, cmd)
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	pid := cmd.Process.Pid
	t.Cleanup(func() {
		_ = syscall.Kill(pid, syscall.SIGCONT)
		_ = cmd.Process.Kill()
		_ = cmd.Wait()
	})
	var local string
	if l := lines.next(t, lineWait); !strings.HasPrefix(l, "local ") {
		t.Fatalf("the Watch child's first line %q, want its address; stderr %q", l, childErr.String())
	} else {
		local = strings.TrimPrefix(l, "local ")
	}
	readTo := func(rev int64) {
		t.Helper()
		for {
			var got int64
			if _, err := fmt.Sscanf(lines.next(t, lineWait), "rev %d", &got); err == nil && got >= rev {
				return
			}
		}
	}
	readTo(last)
	for { // until both regnodes count both subscribers
		r, err := api.WaitApplied(ctx, &registryv1.WaitAppliedRequest{Service: "orders", Revision: last, Timeout: durationpb.New(0)})
		if err != nil {
			t.Fatal(err)
		}
		if r.Done && r.Subscribers == 1 && r.WatchStreams == 1 {
			break
		}
		if ctx.Err() != nil {
			t.Fatalf("the regnodes never counted the subscriber and the Watch stream: %v", r)
		}
		time.Sleep(50 * time.Millisecond)
	}

	if err := syscall.Kill(pid, syscall.SIGSTOP); err != nil {
		t.Fatal(err)
	}
	// 20 records of about 14 KiB in one transaction: one message of 280
	// KiB, far past the stopped child's window and the regnode's write
	// quota, so that the regnode's next send to it blocks.
	keys := record.NewKeys(rns[0].Prefix)
	var puts []clientv3.Op
	for i := range 20 {
		in := &registryv1.Instance{Service: "orders", Id: fmt.Sprintf("big-%02d", i), Address: "10.0.1.1:80", Metadata: map[string]string{}}
		for k := range 14 {
			in.Metadata[fmt.Sprintf("blob%02d", k)] = strings.Repeat("x", 1000)
		}
		b, err := record.Encode(in)
		if err != nil {
			t.Fatal(err)
		}
		puts = append(puts, clientv3.OpPut(keys.Instance("orders", in.Id), string(b)))
	}
	if _, err := rns[0].Etcd.Txn(ctx).Then(puts...).Commit(); err != nil {
		t.Fatal(err)
	}
	r := regctl(t, nil, "--endpoints", rns[0].Addr, "--timeout", "3s", "drain", "orders/o-1", "--wait")
	if r.code != 1 || !strings.Contains(r.stdout, "orders/o-1 DRAINING") {
		t.Fatalf("drain --wait with a stopped Watch client: want the drain printed and exit 1; %v", r)
	}
	for _, want := range []string{
		"0 of 1 live subscribers of orders have not applied revision",
		", and 1 of 1 Watch streams of orders (they cannot acknowledge) have not been sent revision",
		"after 3s",
		fmt.Sprintf("regnode %s (%s): 1 of 1 Watch streams not sent it: watch-child/%d (%s, sent up to revision ", rns[1].Node.Name(), rns[1].Addr, pid, local),
	} {
		if !strings.Contains(r.stderr, want) {
			t.Errorf("stderr lacks %q; %v", want, r)
		}
	}
	if strings.Contains(r.stderr, "sdk") {
		t.Errorf("stderr names the subscriber that applied the drain; %v", r)
	}
	var drainRev int64
	if _, err := fmt.Sscanf(r.stdout[strings.Index(r.stdout, "(revision "):], "(revision %d)", &drainRev); err != nil {
		t.Fatalf("no revision in %q: %v", r.stdout, err)
	}

	if err := syscall.Kill(pid, syscall.SIGCONT); err != nil {
		t.Fatal(err)
	}
	readTo(drainRev)
	r = mustOK(t, regctl(t, nil, "--endpoints", rns[0].Addr, "--timeout", "30s", "drain", "orders/o-2", "--wait"))
	if !strings.Contains(r.stdout, "orders/o-2 DRAINING") ||
		!strings.Contains(r.stdout, "applied by all 1 live subscribers on 2 regnodes; 1 Watch stream cannot acknowledge; sent to all") {
		t.Fatalf("drain --wait with the Watch client reading: %v", r)
	}
}
