package main

import (
	"bufio"
	"context"
	"fmt"
	"io"
	"os"
	"runtime/pprof"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/stats"

	"github.com/regcluster/registry/client"
)

// scaleChildArg, as the first argument, makes regbench (or its test
// binary) one of scale's subscriber processes:
//
//	__regbench-scale-subscribers ENDPOINTS SERVICE K
//
// K SDK clients, each of every regnode in ENDPOINTS (comma-separated; the
// client's picker spreads their Subscribe streams over them), each
// subscribing to SERVICE. It prints "ready RSS0 RSS1" once every
// subscription has its first view, then answers one command per line on
// stdin (each answer starts with the command's word):
//
//	sightings           → sightings K:UNIXNANO ... (the slowest client's revision of SERVICE, when it moved)
//	sub SVC / unsub SVC → every client (un)subscribes SVC; sub answers once all are ready
//	stats SVC           → stats CHANGES EVENTS SNAPSHOTS BYTES REGRESSIONS MINREV (over every client)
//	streams             → streams N: Subscribe streams the clients opened (each client's first, and every resume)
//	where               → where ADDR=N ... (clients by the regnode their Subscribe stream is on)
//	mark ADDR           → mark N: the clients on ADDR now are followed until moved
//	target REV          → target: a marked client is moved once its stream is elsewhere and its view of SERVICE is at REV or past
//	moved               → moved MARKED CONVERGED UNIXNANO... (CONVERGED: clients, marked or not, at REV or past; then when each moved one was)
//
// BYTES counts every message on the clients' Subscribe streams (gRPC wire
// length). It stops, closing everything, when stdin closes.
const scaleChildArg = "__regbench-scale-subscribers"

// subStat is what one client's subscription of one service saw.
type subStat struct {
	rev, regressions, changes, events, snapshots atomic.Int64
}

func (st *subStat) onChange(ch client.Change) {
	if ch.Revision < st.rev.Load() {
		st.regressions.Add(1)
	} else {
		st.rev.Store(ch.Revision)
	}
	switch {
	case ch.Progress:
	case ch.Snapshot:
		st.snapshots.Add(1)
	default:
		st.changes.Add(1)
		st.events.Add(int64(len(ch.Added) + len(ch.Updated) + len(ch.Removed)))
	}
}

// streamTap is a client's gRPC stats handler: the regnode its current
// Subscribe stream is on, and the bytes every Subscribe stream brought.
type streamTap struct {
	bytes   atomic.Int64
	streams atomic.Int64 // Subscribe streams opened: past the first, resumes
	mu      sync.Mutex
	cur     *int // the current stream's tag
	at      string
}

type tapKey struct{}

func (t *streamTap) TagRPC(ctx context.Context, info *stats.RPCTagInfo) context.Context {
	if strings.HasSuffix(info.FullMethodName, "/Subscribe") {
		return context.WithValue(ctx, tapKey{}, new(int))
	}
	return ctx
}

func (t *streamTap) HandleRPC(ctx context.Context, s stats.RPCStats) {
	tag, _ := ctx.Value(tapKey{}).(*int)
	if tag == nil {
		return
	}
	switch x := s.(type) {
	case *stats.OutHeader:
		t.streams.Add(1)
		if x.RemoteAddr != nil {
			t.mu.Lock()
			t.cur, t.at = tag, x.RemoteAddr.String()
			t.mu.Unlock()
		}
	case *stats.InPayload:
		t.bytes.Add(int64(x.WireLength))
	case *stats.End:
		// Only the current stream's end: an older stream may report its
		// end after its successor's header.
		t.mu.Lock()
		if t.cur == tag {
			t.cur, t.at = nil, ""
		}
		t.mu.Unlock()
	}
}

func (t *streamTap) where() string {
	t.mu.Lock()
	defer t.mu.Unlock()
	return t.at
}

func (*streamTap) TagConn(ctx context.Context, _ *stats.ConnTagInfo) context.Context { return ctx }
func (*streamTap) HandleConn(context.Context, stats.ConnStats)                       {}

type scaleClient struct {
	c    *client.Client
	tap  *streamTap
	subs map[string]*client.Subscription // by service, under scaleChild.mu
	stat map[string]*subStat
}

type scaleChild struct {
	service string
	clients []*scaleClient
	watched []*subStat // each client's subStat of service

	mu      sync.Mutex
	victim  string
	target  int64
	marked  []int // client indexes
	movedAt []time.Time
}

func scaleChildMain(args []string, stdin io.Reader, stdout io.Writer) int {
	if err := runScaleChild(args, stdin, stdout); err != nil {
		fmt.Fprintf(os.Stderr, "regbench scale subscribers: %v\n", err)
		return 1
	}
	return 0
}

func runScaleChild(args []string, stdin io.Reader, stdout io.Writer) error {
	if len(args) != 3 {
		return fmt.Errorf("want ENDPOINTS SERVICE K, got %q", args)
	}
	eps, service := strings.Split(args[0], ","), args[1]
	K, err := strconv.Atoi(args[2])
	if err != nil || K < 1 {
		return fmt.Errorf("K: %q", args[2])
	}
	// REGBENCH_CHILD_CPUPROFILE=PREFIX profiles each child's whole run
	// into PREFIX.PID (the subscribers' side, which -cpuprofile of the
	// parent does not see).
	if prefix := os.Getenv("REGBENCH_CHILD_CPUPROFILE"); prefix != "" {
		f, err := os.Create(fmt.Sprintf("%s.%d", prefix, os.Getpid()))
		if err != nil {
			return err
		}
		if err := pprof.StartCPUProfile(f); err != nil {
			f.Close()
			return err
		}
		defer func() {
			pprof.StopCPUProfile()
			f.Close()
		}()
	}
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	e := &env{log: childLog()}
	defer e.close()
	ch := &scaleChild{service: service}
	e.onClose(func() {
		for _, sc := range ch.clients {
			for _, s := range sc.subs {
				s.Close()
			}
			sc.c.Close()
		}
	})
	rss0 := settledRSS()
	for i := range K {
		tap := &streamTap{}
		var c *client.Client
		// Client i lists the regnodes starting at the i-th: with the
		// same list for all, most first streams land on one regnode
		// (the first connection ready takes the first pick).
		rot := append(append([]string(nil), eps[i%len(eps):]...), eps[:i%len(eps)]...)
		labeled(sideClient, func() {
			c, err = client.New(client.Config{Endpoints: rot, Logger: e.log, DialOptions: []grpc.DialOption{grpc.WithStatsHandler(tap)}})
		})
		if err != nil {
			return err
		}
		ch.clients = append(ch.clients, &scaleClient{c: c, tap: tap, subs: map[string]*client.Subscription{}, stat: map[string]*subStat{}})
	}
	if err := ch.subscribe(ctx, service); err != nil {
		return err
	}
	for _, sc := range ch.clients {
		ch.watched = append(ch.watched, sc.stat[service])
	}
	rss1 := settledRSS()

	mon := &observer{}
	var wg sync.WaitGroup
	wg.Add(1)
	go func() { // every millisecond: the slowest client's revision, and who has moved
		defer wg.Done()
		t := time.NewTicker(time.Millisecond)
		defer t.Stop()
		for {
			select {
			case <-ctx.Done():
				return
			case <-t.C:
			}
			m := int64(-1)
			for _, st := range ch.watched {
				if v := st.rev.Load(); m < 0 || v < m {
					m = v
				}
			}
			now := time.Now()
			mon.saw(m, now)
			ch.mu.Lock()
			if ch.target > 0 {
				for j, i := range ch.marked {
					if ch.movedAt[j].IsZero() {
						at := ch.clients[i].tap.where()
						if at != "" && at != ch.victim && ch.watched[i].rev.Load() >= ch.target {
							ch.movedAt[j] = now
						}
					}
				}
			}
			ch.mu.Unlock()
		}
	}()
	defer wg.Wait()
	defer cancel()

	fmt.Fprintf(stdout, "ready %d %d\n", rss0, rss1)
	sc := bufio.NewScanner(stdin)
	for sc.Scan() {
		f := strings.Fields(sc.Text())
		if len(f) == 0 {
			continue
		}
		var b strings.Builder
		b.WriteString(f[0])
		switch {
		case f[0] == "sightings":
			mon.mu.Lock()
			for _, s := range mon.seen {
				fmt.Fprintf(&b, " %d:%d", s.key, s.at.UnixNano())
			}
			mon.mu.Unlock()
		case f[0] == "sub" && len(f) == 2:
			if err := ch.subscribe(ctx, f[1]); err != nil {
				return err
			}
		case f[0] == "unsub" && len(f) == 2:
			ch.unsubscribe(f[1])
		case f[0] == "stats" && len(f) == 2:
			var changes, events, snaps, bytes, regress int64
			minRev := int64(-1)
			ch.mu.Lock()
			for _, c := range ch.clients {
				bytes += c.tap.bytes.Load()
				for _, st := range c.stat {
					regress += st.regressions.Load()
				}
				st := c.stat[f[1]]
				if st == nil {
					continue
				}
				changes += st.changes.Load()
				events += st.events.Load()
				snaps += st.snapshots.Load()
				if r := st.rev.Load(); minRev < 0 || r < minRev {
					minRev = r
				}
			}
			ch.mu.Unlock()
			fmt.Fprintf(&b, " %d %d %d %d %d %d", changes, events, snaps, bytes, regress, minRev)
		case f[0] == "streams":
			var n int64
			for _, c := range ch.clients {
				n += c.tap.streams.Load()
			}
			fmt.Fprintf(&b, " %d", n)
		case f[0] == "where":
			by := map[string]int{}
			for _, c := range ch.clients {
				by[c.tap.where()]++
			}
			for a, n := range by {
				if a == "" {
					a = "none"
				}
				fmt.Fprintf(&b, " %s=%d", a, n)
			}
		case f[0] == "mark" && len(f) == 2:
			ch.mu.Lock()
			ch.victim, ch.target, ch.marked, ch.movedAt = f[1], 0, nil, nil
			for i, c := range ch.clients {
				if c.tap.where() == f[1] {
					ch.marked = append(ch.marked, i)
				}
			}
			ch.movedAt = make([]time.Time, len(ch.marked))
			fmt.Fprintf(&b, " %d", len(ch.marked))
			ch.mu.Unlock()
		case f[0] == "target" && len(f) == 2:
			rev, err := strconv.ParseInt(f[1], 10, 64)
			if err != nil {
				return fmt.Errorf("target: %w", err)
			}
			ch.mu.Lock()
			ch.target = rev
			ch.mu.Unlock()
		case f[0] == "moved":
			ch.mu.Lock()
			conv := 0
			for _, st := range ch.watched {
				if ch.target > 0 && st.rev.Load() >= ch.target {
					conv++
				}
			}
			fmt.Fprintf(&b, " %d %d", len(ch.marked), conv)
			for _, t := range ch.movedAt {
				if !t.IsZero() {
					fmt.Fprintf(&b, " %d", t.UnixNano())
				}
			}
			ch.mu.Unlock()
		default:
			return fmt.Errorf("unknown command %q", sc.Text())
		}
		fmt.Fprintln(stdout, b.String())
	}
	return nil
}

// subscribe makes every client subscribe to service and waits until every
// subscription has its first view.
func (ch *scaleChild) subscribe(ctx context.Context, service string) error {
	subs := make([]*client.Subscription, len(ch.clients))
	sts := make([]*subStat, len(ch.clients))
	for i, c := range ch.clients {
		st := &subStat{}
		sts[i] = st
		var (
			s   *client.Subscription
			err error
		)
		labeled(sideClient, func() {
			s, err = c.c.Subscribe(ctx, service, client.SubscribeOptions{OnChange: st.onChange})
		})
		if err != nil {
			return err
		}
		ch.mu.Lock()
		c.subs[service], c.stat[service] = s, st
		ch.mu.Unlock()
		subs[i] = s
	}
	for _, s := range subs {
		if err := s.WaitReady(ctx); err != nil {
			return err
		}
	}
	// OnChange runs behind the view (on the subscription's callback
	// goroutine): ready means the view has its snapshot, not that the
	// callback was told. Counting from here would count that snapshot
	// in whatever is measured next.
	for _, st := range sts {
		for st.snapshots.Load() == 0 {
			select {
			case <-ctx.Done():
				return ctx.Err()
			case <-time.After(5 * time.Millisecond):
			}
		}
	}
	return nil
}

func (ch *scaleChild) unsubscribe(service string) {
	ch.mu.Lock()
	var subs []*client.Subscription
	for _, c := range ch.clients {
		if s := c.subs[service]; s != nil {
			subs = append(subs, s)
			delete(c.subs, service)
			delete(c.stat, service)
		}
	}
	ch.mu.Unlock()
	for _, s := range subs {
		s.Close()
	}
}

// scaleProc is the parent's handle on one of scale's subscriber processes.
type scaleProc struct {
	*childProc
	K int
}

// startScaleProc starts a child of K clients; ready waits for its line.
func startScaleProc(ctx context.Context, endpoints []string, service string, K int) (*scaleProc, error) {
	c, err := startChild(ctx, "scale subscriber process", scaleChildArg, strings.Join(endpoints, ","), service, strconv.Itoa(K))
	if err != nil {
		return nil, err
	}
	return &scaleProc{childProc: c, K: K}, nil
}

func (p *scaleProc) ints(cmd string) ([]int64, error) {
	f, err := p.ask(cmd)
	if err != nil {
		return nil, err
	}
	out := make([]int64, len(f))
	for i, s := range f {
		if out[i], err = strconv.ParseInt(s, 10, 64); err != nil {
			return nil, fmt.Errorf("%s: bad answer %q", cmd, f)
		}
	}
	return out, nil
}
