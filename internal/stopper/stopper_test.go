package stopper_test

import (
	"context"
	"errors"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"go.uber.org/goleak"

	"github.com/regcluster/registry/internal/stopper"
)

func TestMain(m *testing.M) { goleak.VerifyTestMain(m) }

// journal is the shared log every test component writes to.
type journal struct {
	mu    sync.Mutex
	lines []string
}

func (j *journal) add(s string) {
	j.mu.Lock()
	j.lines = append(j.lines, s)
	j.mu.Unlock()
}

func (j *journal) get() []string {
	j.mu.Lock()
	defer j.mu.Unlock()
	return slices.Clone(j.lines)
}

// part is a component with every hook, each recording itself: "start x",
// "cancel x" (its Run saw its context end), "close x".
func part(j *journal, name string, quiesce bool) stopper.Component {
	return stopper.Component{Name: name, Quiesce: quiesce,
		Start: func(context.Context) error { j.add("start " + name); return nil },
		Run: func(ctx context.Context) error {
			<-ctx.Done()
			j.add("cancel " + name)
			return ctx.Err()
		},
		Close: func() error { j.add("close " + name); return nil },
	}
}

func startAll(t *testing.T, s *stopper.Stopper, cs ...stopper.Component) {
	t.Helper()
	for _, c := range cs {
		if err := s.Start(context.Background(), c); err != nil {
			t.Fatalf("Start %s: %v", c.Name, err)
		}
	}
}

// Stop goes latest first, each component cancelled, waited for and closed
// before the one started before it is touched.
func TestStopOrder(t *testing.T) {
	j := &journal{}
	s := stopper.New()
	startAll(t, s, part(j, "etcd", false), part(j, "pool", false), part(j, "api", false))
	if got, want := s.Started(), []string{"etcd", "pool", "api"}; !slices.Equal(got, want) {
		t.Fatalf("Started: %q, want %q", got, want)
	}
	if err := s.Stop(); err != nil {
		t.Fatalf("Stop: %v", err)
	}
	want := []string{"start etcd", "start pool", "start api",
		"cancel api", "close api", "cancel pool", "close pool", "cancel etcd", "close etcd"}
	if got := j.get(); !slices.Equal(got, want) {
		t.Fatalf("journal:\n got %q\nwant %q", got, want)
	}
	if got := s.Started(); len(got) != 0 {
		t.Fatalf("Started after Stop: %q", got)
	}
}

// Quiesce components are all cancelled before anything is waited for or
// closed, and are then waited for and closed in their turn.
func TestQuiesceFirst(t *testing.T) {
	j := &journal{}
	s := stopper.New()
	// The API's Run, stopped first in turn, returns only once both
	// quiesced components saw their cancel (as a gRPC server's graceful
	// stop waits for the streams the fan-out hub ends): without the
	// quiesce step it gives up after a bound that only a broken build
	// meets, and says so.
	quiesced := func(name string) (stopper.Component, chan struct{}) {
		done := make(chan struct{})
		c := part(j, name, true)
		run := c.Run
		c.Run = func(ctx context.Context) error { defer close(done); return run(ctx) }
		return c, done
	}
	hub, hubDone := quiesced("hub")
	el, elDone := quiesced("election")
	api := part(j, "api", false)
	api.Run = func(ctx context.Context) error {
		<-ctx.Done()
		for _, done := range []chan struct{}{hubDone, elDone} {
			select {
			case <-done:
			case <-time.After(10 * time.Second):
				j.add("api gave up waiting")
				return nil
			}
		}
		j.add("cancel api")
		return nil
	}
	startAll(t, s, part(j, "etcd", false), hub, el, api)
	if got, want := s.Started(), []string{"etcd", "hub (quiesce)", "election (quiesce)", "api"}; !slices.Equal(got, want) {
		t.Fatalf("Started: %q, want %q", got, want)
	}
	if err := s.Stop(); err != nil {
		t.Fatalf("Stop: %v", err)
	}
	got := j.get()[4:]   // past the starts
	slices.Sort(got[:2]) // the two quiesced Runs record their cancel concurrently
	want := []string{"cancel election", "cancel hub", "cancel api", "close api",
		"close election", "close hub", "cancel etcd", "close etcd"}
	if !slices.Equal(got, want) {
		t.Fatalf("journal past the starts:\n got %q\nwant %q", got, want)
	}
}

// Stop twice, and concurrently, stops once and returns the same result;
// Stop before any Start is a no-op; Start after Stop is refused.
func TestStopIdempotent(t *testing.T) {
	if err := stopper.New().Stop(); err != nil {
		t.Fatalf("Stop with nothing started: %v", err)
	}
	j := &journal{}
	s := stopper.New()
	c := part(j, "a", false)
	c.Close = func() error { j.add("close a"); return errors.New("boom") }
	startAll(t, s, c)
	var wg sync.WaitGroup
	errs := make([]error, 3)
	for i := range errs {
		wg.Add(1)
		go func() { defer wg.Done(); errs[i] = s.Stop() }()
	}
	wg.Wait()
	for i, err := range errs {
		if err == nil || !strings.Contains(err.Error(), "close a: boom") {
			t.Fatalf("Stop %d: %v, want close a: boom", i, err)
		}
	}
	if got, want := j.get(), []string{"start a", "cancel a", "close a"}; !slices.Equal(got, want) {
		t.Fatalf("journal after three Stops:\n got %q\nwant %q", got, want)
	}
	err := s.Start(context.Background(), part(j, "late", false))
	if !errors.Is(err, stopper.ErrStopped) {
		t.Fatalf("Start after Stop: %v, want ErrStopped", err)
	}
	if got := j.get(); len(got) != 3 {
		t.Fatalf("Start after Stop ran the component: %q", got)
	}
}

// A component that fails to start stops the ones started before it, in
// reverse, and is itself neither run nor closed.
func TestFailedStartStopsEarlierInReverse(t *testing.T) {
	j := &journal{}
	s := stopper.New()
	startAll(t, s, part(j, "a", false), part(j, "b", false))
	errBad := errors.New("port in use")
	bad := part(j, "c", false)
	bad.Start = func(context.Context) error { j.add("start c"); return errBad }
	err := s.Start(context.Background(), bad)
	if !errors.Is(err, errBad) || err.Error() != "port in use" {
		t.Fatalf("Start of a failing component: %v, want its own error", err)
	}
	want := []string{"start a", "start b", "start c", "cancel b", "close b", "cancel a", "close a"}
	if got := j.get(); !slices.Equal(got, want) {
		t.Fatalf("journal:\n got %q\nwant %q", got, want)
	}
	if err := s.Stop(); err != nil {
		t.Fatalf("Stop after a failed start: %v", err)
	}
	if got := j.get(); len(got) != len(want) {
		t.Fatalf("Stop after a failed start stopped again: %q", got)
	}
}

// A Run that ends on its own is sent on Err at once, and kept for Stop
// with the others' errors, each wrapped with its component's name.
func TestRunFailureAndErrors(t *testing.T) {
	s := stopper.New()
	errListen := errors.New("accept: too many open files")
	errClose := errors.New("flush failed")
	errDrain := errors.New("drain cut short")
	startAll(t, s,
		stopper.Component{Name: "store", Close: func() error { return errClose }},
		stopper.Component{Name: "api", Run: func(context.Context) error { return errListen }},
		stopper.Component{Name: "http", Run: func(ctx context.Context) error { <-ctx.Done(); return errDrain }},
		stopper.Component{Name: "watch", Run: func(ctx context.Context) error { <-ctx.Done(); return ctx.Err() }},
	)
	var err error
	select {
	case err = <-s.Err():
	case <-time.After(30 * time.Second): // a bound only a broken build meets
		s.Stop()
		t.Fatal("a Run that failed on its own was not sent on Err")
	}
	if !errors.Is(err, errListen) || err.Error() != "api: "+errListen.Error() {
		t.Fatalf("Err: %v", err)
	}
	err = s.Stop()
	for _, e := range []error{errListen, errClose, errDrain} {
		if !errors.Is(err, e) {
			t.Errorf("Stop's error %q does not wrap %q", err, e)
		}
	}
	for _, s := range []string{"close store: flush failed", "stop http: drain cut short", "api: accept"} {
		if !strings.Contains(err.Error(), s) {
			t.Errorf("Stop's error %q does not say %q", err, s)
		}
	}
	if errors.Is(err, context.Canceled) {
		t.Errorf("Stop's error %q keeps a Run's context.Canceled", err)
	}
}

// A Stop that begins while a component's Start runs leaves that component
// to Start, which closes it (its Run never starts) and says ErrStopped.
func TestStopDuringStart(t *testing.T) {
	j := &journal{}
	s := stopper.New()
	startAll(t, s, part(j, "a", false))
	inStart, release := make(chan struct{}), make(chan struct{})
	slow := part(j, "slow", false)
	slow.Start = func(context.Context) error { close(inStart); <-release; j.add("start slow"); return nil }
	errc := make(chan error, 1)
	go func() { errc <- s.Start(context.Background(), slow) }()
	<-inStart
	if err := s.Stop(); err != nil {
		t.Fatalf("Stop: %v", err)
	}
	close(release)
	if err := <-errc; !errors.Is(err, stopper.ErrStopped) {
		t.Fatalf("Start overtaken by Stop: %v, want ErrStopped", err)
	}
	want := []string{"start a", "cancel a", "close a", "start slow", "close slow"}
	if got := j.get(); !slices.Equal(got, want) {
		t.Fatalf("journal:\n got %q\nwant %q", got, want)
	}
}
