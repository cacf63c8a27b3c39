package main

import (
	"bufio"
	"context"
	"errors"
	"fmt"
	"io"
	"os"
	"os/exec"
	"runtime"
	"runtime/debug"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	clientv3 "go.etcd.io/etcd/client/v3"

	"github.com/regcluster/registry/client"
	"github.com/regcluster/registry/record"
)

// childArg, as the first argument, makes regbench (or its test binary) the
// subscriber process of fanout: the subscribers live in another process
// so that the regnode's (or etcd's) memory and CPU per subscriber can be
// read off the parent alone.
const childArg = "__regbench-subscribers"

// childMain runs S subscribers of one kind:
//
//	__regbench-subscribers ours|etcd ENDPOINT SERVICE S CLIENTS
//
// (the S subscriptions spread over CLIENTS SDK clients, or the S etcd
// watchers over CLIENTS clientv3 clients).
//
// It prints "warm" once connected (with one subscriber, so the connection
// is not counted per subscriber) and waits for "go" on stdin; then
// "ready RSS0 RSS1" once every subscriber has its first view
// (RSS before and after subscribing, after a GC), then answers commands on
// stdin, one per line: "cpu" → "cpu NANOS" (its CPU time so far),
// "sightings" → "sightings K:UNIXNANO ..." (when the slowest subscriber's
// revision moved). It stops, closing everything, when stdin closes.
func childMain(args []string, stdin io.Reader, stdout io.Writer) int {
	if err := child(args, stdin, stdout); err != nil {
		fmt.Fprintf(os.Stderr, "regbench subscribers: %v\n", err)
		return 1
	}
	return 0
}

func child(args []string, stdin io.Reader, stdout io.Writer) error {
	if len(args) != 5 {
		return fmt.Errorf("want ours|etcd ENDPOINT SERVICE S CLIENTS, got %q", args)
	}
	kind, endpoint, service := args[0], args[1], args[2]
	S, err := strconv.Atoi(args[3])
	if err != nil || S < 1 {
		return fmt.Errorf("S: %q", args[3])
	}
	K, err := strconv.Atoi(args[4])
	if err != nil || K < 1 {
		return fmt.Errorf("CLIENTS: %q", args[4])
	}
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	e := &env{log: quiet(false)}
	defer e.close()
	revs := make([]atomic.Int64, S)

	var start func(i int) error
	var wait func() error
	switch kind {
	case "ours":
		// Subscription i rides client i mod K: a Client's subscriptions
		// of one service share one feed, one subscriber on the regnode.
		clients := make([]*client.Client, 0, K)
		for range K {
			c, err := regClient(e, endpoint)
			if err != nil {
				return err
			}
			e.onClose(func() { c.Close() })
			clients = append(clients, c)
		}
		c := clients[0]
		var subs []*client.Subscription
		e.onClose(func() {
			for _, s := range subs {
				s.Close()
			}
		})
		warm, err := c.Subscribe(ctx, service, client.SubscribeOptions{})
		if err != nil {
			return err
		}
		subs = append(subs, warm)
		if err := warm.WaitReady(ctx); err != nil {
			return err
		}
		start = func(i int) error {
			s, err := clients[i%K].Subscribe(ctx, service, client.SubscribeOptions{OnChange: func(ch client.Change) { revs[i].Store(ch.Revision) }})
			if err == nil {
				subs = append(subs, s)
			}
			return err
		}
		wait = func() error {
			for _, s := range subs {
				if err := s.WaitReady(ctx); err != nil {
					return err
				}
			}
			return nil
		}
	case "etcd":
		// Watcher i on clientv3 client i mod K (one watch stream each).
		clients := make([]*clientv3.Client, 0, K)
		for range K {
			c, err := etcdClient(sideClient, endpoint, nil)
			if err != nil {
				return err
			}
			e.onClose(func() { c.Close() })
			clients = append(clients, c)
		}
		ws := newWatchers(ctx, func(i int) *clientv3.Client { return clients[i%K] }, record.NewKeys(directPrefix), service)
		e.onClose(ws.stop)
		if err := ws.start(1, func(int, int64, time.Time) {}); err != nil {
			return err
		}
		start = func(int) error { return nil }
		wait = func() error { return ws.start(S, func(i int, rev int64, _ time.Time) { revs[i].Store(rev) }) }
	default:
		return fmt.Errorf("kind %q", kind)
	}
	// The connection is up and counted: tell the parent, and wait for it
	// to read its own memory before subscribing.
	fmt.Fprintln(stdout, "warm")
	sc := bufio.NewScanner(stdin)
	if !sc.Scan() || sc.Text() != "go" {
		return errors.New("parent did not say go")
	}
	rss0 := settledRSS()
	for i := range S {
		if err := start(i); err != nil {
			return err
		}
	}
	if err := wait(); err != nil {
		return err
	}
	rss1 := settledRSS()
	mon := &observer{}
	var wg sync.WaitGroup
	wg.Add(1)
	go func() { // the slowest subscriber's revision, every millisecond
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
			for i := range revs {
				if v := revs[i].Load(); m < 0 || v < m {
					m = v
				}
			}
			mon.saw(m, time.Now())
		}
	}()
	defer wg.Wait()
	defer cancel()
	fmt.Fprintf(stdout, "ready %d %d\n", rss0, rss1)
	for sc.Scan() {
		switch sc.Text() {
		case "cpu":
			fmt.Fprintf(stdout, "cpu %d\n", cpuTime())
		case "sightings":
			mon.mu.Lock()
			var b strings.Builder
			b.WriteString("sightings")
			for _, s := range mon.seen {
				fmt.Fprintf(&b, " %d:%d", s.key, s.at.UnixNano())
			}
			mon.mu.Unlock()
			fmt.Fprintln(stdout, b.String())
		}
	}
	return nil
}

func settledRSS() int64 {
	runtime.GC()
	runtime.GC()
	debug.FreeOSMemory()
	return rssBytes()
}

// childProc is the parent's end of a regbench child process: commands
// go on the child's stdin, and each answer is one line on its stdout
// that starts with the command's word. The subscriber children of the
// fanout and scale scenarios share it.
type childProc struct {
	what       string // how errors name the child
	cmd        *exec.Cmd
	in         io.WriteCloser
	out        *bufio.Scanner
	rss0, rss1 int64 // the child's RSS before and after subscribing (its "ready" line)
	waitOnce   sync.Once
	waitErr    error
}

// startChild runs this binary again with args, its stdout read as answer
// lines.
func startChild(ctx context.Context, what string, args ...string) (*childProc, error) {
	exe, err := os.Executable()
	if err != nil {
		return nil, err
	}
	cmd := exec.CommandContext(ctx, exe, args...)
	cmd.Stderr = os.Stderr
	cmd.WaitDelay = 5 * time.Second
	in, err := cmd.StdinPipe()
	if err != nil {
		return nil, err
	}
	out, err := cmd.StdoutPipe()
	if err != nil {
		return nil, err
	}
	if err := cmd.Start(); err != nil {
		return nil, err
	}
	p := &childProc{what: what, cmd: cmd, in: in, out: bufio.NewScanner(out)}
	p.out.Buffer(make([]byte, 64<<10), 64<<20)
	return p, nil
}

// ready reads the child's "ready RSS0 RSS1" line.
func (p *childProc) ready() error {
	f, err := p.line("ready")
	if err != nil {
		return err
	}
	if len(f) != 2 {
		return fmt.Errorf("%s: bad ready line %q", p.what, f)
	}
	p.rss0, _ = strconv.ParseInt(f[0], 10, 64)
	p.rss1, _ = strconv.ParseInt(f[1], 10, 64)
	return nil
}

// line reads the next line, which must start with word; it returns the
// rest split on spaces.
func (p *childProc) line(word string) ([]string, error) {
	if !p.out.Scan() {
		err := p.out.Err()
		if err == nil {
			err = errors.New("closed its output")
		}
		return nil, fmt.Errorf("%s: %w (exit: %v)", p.what, err, p.stop())
	}
	f := strings.Fields(p.out.Text())
	if len(f) == 0 || f[0] != word {
		return nil, fmt.Errorf("%s: want %q, got %q", p.what, word, p.out.Text())
	}
	return f[1:], nil
}

// ask sends a command and returns its answer's fields after the word.
func (p *childProc) ask(cmd string) ([]string, error) {
	if _, err := fmt.Fprintln(p.in, cmd); err != nil {
		return nil, err
	}
	return p.line(strings.Fields(cmd)[0])
}

// sightings asks the child when its subscribers first saw each key.
func (p *childProc) sightings() (*observer, error) {
	f, err := p.ask("sightings")
	if err != nil {
		return nil, err
	}
	o := &observer{}
	for _, kv := range f {
		k, t, ok := strings.Cut(kv, ":")
		if !ok {
			continue
		}
		key, err1 := strconv.ParseInt(k, 10, 64)
		at, err2 := strconv.ParseInt(t, 10, 64)
		if err1 == nil && err2 == nil {
			o.saw(key, time.Unix(0, at))
		}
	}
	return o, nil
}

// stop closes the child's stdin (it closes its subscribers and exits) and
// waits for it.
func (p *childProc) stop() error {
	p.waitOnce.Do(func() {
		p.in.Close()
		p.waitErr = p.cmd.Wait()
	})
	return p.waitErr
}

// subscriberProc is the parent's handle on a child process of subscribers.
type subscriberProc struct{ *childProc }

// startSubscribers starts the child and waits until it is connected.
// go_ lets it subscribe and waits for "ready".
func startSubscribers(ctx context.Context, kind, endpoint, service string, S, clients int) (*subscriberProc, error) {
	c, err := startChild(ctx, "subscriber process", childArg, kind, endpoint, service, strconv.Itoa(S), strconv.Itoa(clients))
	if err != nil {
		return nil, err
	}
	p := &subscriberProc{c}
	if _, err := p.line("warm"); err != nil {
		p.stop()
		return nil, err
	}
	return p, nil
}

func (p *subscriberProc) go_() error {
	if _, err := fmt.Fprintln(p.in, "go"); err != nil {
		return err
	}
	return p.ready()
}

func (p *subscriberProc) cpu() (time.Duration, error) {
	f, err := p.ask("cpu")
	if err != nil {
		return 0, err
	}
	if len(f) != 1 {
		return 0, fmt.Errorf("subscriber process: bad cpu line %q", f)
	}
	n, err := strconv.ParseInt(f[0], 10, 64)
	return time.Duration(n), err
}
