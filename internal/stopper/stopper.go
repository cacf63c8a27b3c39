// Package stopper owns the long-lived parts of a process: it starts them
// one after another and stops them in the reverse order, so that nothing
// is stopped while a part started after it (and so possibly using it) still
// runs.
//
// A part is a Component: an optional Start (run at once, in the caller's
// goroutine), an optional Run (the part's goroutine, owned by the Stopper)
// and an optional Close. Stop goes in two steps:
//
//  1. quiesce: the context of every component marked Quiesce is cancelled,
//     latest first, all at once; nothing is waited for yet. This is for
//     what must end before anything else stops, and without waiting for
//     it: leaving a cluster, ending the streams that would hold a server
//     open.
//  2. in turn, latest first, for each component: cancel its context, wait
//     for its Run to return, then Close it.
//
// So a component's Close runs only once its own Run and every component
// started after it are done. Stop is idempotent and safe before (or
// without) any Start; a Start that fails stops, in reverse, what was
// started before it. The errors of every Start, Run and Close are kept,
// each wrapped with %w and the component's name.
//
// Why not golang.org/x/sync/errgroup or github.com/oklog/run: both stop
// every member at once, on the first error or return, and wait for them in
// no order; neither closes anything after its goroutines are done, nor
// stops in a stated order, which is what a server over an etcd client
// needs (drain the API's calls, then close the lease pool that serves
// them, then the client they all use).
package stopper

import (
	"context"
	"errors"
	"fmt"
	"sync"
)

// ErrStopped is returned by Start once Stop has begun: a component
// started then would have no one to stop it.
var ErrStopped = errors.New("stopper: stopped")

// Component is one long-lived part of a process.
type Component struct {
	// Name says which component an error is of (required).
	Name string
	// Start, if set, brings the component up, in Start's goroutine and
	// under its context. When it fails the component is not started:
	// Start must leave nothing of it behind (Close is not called).
	Start func(ctx context.Context) error
	// Run, if set, is the component's goroutine, started once Start
	// succeeded. Its context is cancelled when the component is stopped
	// (or quiesced), and Run must then return: Stop waits for it without
	// a bound, so a Run that can wait on something outside (a network
	// peer) must bound that wait itself. An error Run returns while its
	// context is live is a failure: it is sent on Err and kept for Stop.
	// An error after the cancel is kept unless it is context.Canceled.
	Run func(ctx context.Context) error
	// Close, if set, releases what the component holds, once its Run has
	// returned and every component started after it is stopped.
	Close func() error
	// Quiesce cancels the component's context in Stop's first step,
	// with the other Quiesce components', instead of in its turn.
	Quiesce bool
}

// Stopper starts Components and stops them in the reverse order. The zero
// value is not usable; call New. It is safe for concurrent use.
type Stopper struct {
	failed chan error // first Run failure; buffered, sent to without blocking

	mu struct {
		sync.Mutex
		started  []*running // in start order
		stopping bool
		stopped  chan struct{} // closed when Stop has returned
		err      error         // Stop's result
	}
}

// running is a started component.
type running struct {
	c      Component
	cancel context.CancelFunc
	done   chan struct{} // closed when Run returned (at once if none)
	err    error         // Run's error, set before done closes
}

// New returns a Stopper with nothing started.
func New() *Stopper {
	s := &Stopper{failed: make(chan error, 1)}
	s.mu.stopped = make(chan struct{})
	return s
}

// Err receives the first failure of a Run: a component that ended on its
// own. Later failures are not sent (Stop returns them all).
func (s *Stopper) Err() <-chan error { return s.failed }

// Started names the components started and not yet stopped, in start
// order; a name ends with " (quiesce)" for a Quiesce component. Stop stops
// them in the reverse order (the quiesced ones signalled first).
func (s *Stopper) Started() []string {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.mu.stopping {
		return nil
	}
	names := make([]string, len(s.mu.started))
	for i, r := range s.mu.started {
		names[i] = r.c.Name
		if r.c.Quiesce {
			names[i] += " (quiesce)"
		}
	}
	return names
}

// Start starts c: its Start, then its Run in a goroutine. If c's Start
// fails, Start stops every component started before it, in reverse, and
// returns c's error (as c's Start returned it) joined with theirs. After Stop has begun it starts
// nothing and returns ErrStopped.
func (s *Stopper) Start(ctx context.Context, c Component) error {
	if c.Name == "" {
		panic("stopper: a Component needs a Name")
	}
	s.mu.Lock()
	stopping := s.mu.stopping
	s.mu.Unlock()
	if stopping {
		return fmt.Errorf("start %s: %w", c.Name, ErrStopped)
	}
	if c.Start != nil {
		if err := c.Start(ctx); err != nil {
			return errors.Join(err, s.Stop())
		}
	}
	rctx, cancel := context.WithCancel(context.Background())
	r := &running{c: c, cancel: cancel, done: make(chan struct{})}
	s.mu.Lock()
	if s.mu.stopping {
		// Stop began while c started: no one will stop c but us.
		s.mu.Unlock()
		cancel()
		close(r.done)
		err := fmt.Errorf("start %s: %w", c.Name, ErrStopped)
		if c.Close != nil {
			if cerr := c.Close(); cerr != nil {
				err = errors.Join(err, fmt.Errorf("close %s: %w", c.Name, cerr))
			}
		}
		return err
	}
	s.mu.started = append(s.mu.started, r)
	s.mu.Unlock()
	if c.Run == nil {
		close(r.done)
		return nil
	}
	go func() {
		defer close(r.done)
		err := c.Run(rctx)
		if err == nil {
			return
		}
		if rctx.Err() == nil { // ended on its own
			r.err = fmt.Errorf("%s: %w", c.Name, err)
			select {
			case s.failed <- r.err:
			default:
			}
			return
		}
		if !errors.Is(err, context.Canceled) {
			r.err = fmt.Errorf("stop %s: %w", c.Name, err)
		}
	}()
	return nil
}

// Stop stops every started component (see the package doc for the order)
// and returns their errors joined. A second Stop, or one made while the
// first runs, waits for the first and returns its result.
func (s *Stopper) Stop() error {
	s.mu.Lock()
	if s.mu.stopping {
		s.mu.Unlock()
		<-s.mu.stopped
		return s.mu.err
	}
	s.mu.stopping = true
	started := s.mu.started
	s.mu.Unlock()

	for i := len(started) - 1; i >= 0; i-- {
		if started[i].c.Quiesce {
			started[i].cancel()
		}
	}
	var errs []error
	for i := len(started) - 1; i >= 0; i-- {
		r := started[i]
		r.cancel()
		<-r.done
		if r.err != nil {
			errs = append(errs, r.err)
		}
		if r.c.Close != nil {
			if err := r.c.Close(); err != nil {
				errs = append(errs, fmt.Errorf("close %s: %w", r.c.Name, err))
			}
		}
	}
	s.mu.Lock()
	s.mu.err = errors.Join(errs...)
	s.mu.Unlock()
	close(s.mu.stopped)
	return s.mu.err
}
