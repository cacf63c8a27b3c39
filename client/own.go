package client

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"time"

	"google.golang.org/grpc"
)

// DefaultCloseTimeout is Config.CloseTimeout's default: room for the
// default drain grace (2s) and the drain and deregister calls.
const DefaultCloseTimeout = 10 * time.Second

// owned is what a Client made and must stop on Close.
type owned struct {
	mu struct {
		sync.Mutex
		closed bool
		regs   map[*Registration]struct{}
		subs   map[*Subscription]struct{}
	}
	// starting counts Register calls past the closed check that have not
	// yet handed their Registration over (or failed): Close waits for
	// them, so none it has not seen is left running.
	starting sync.WaitGroup
	// lingers counts the resolvers' linger timers armed or running.
	lingers sync.WaitGroup
	// refuse, once set (just before the connection closes), makes every
	// call on the connection return ErrClosed.
	refuse chan struct{}

	closeOnce sync.Once
	closeErr  error
}

func (o *owned) init() {
	o.mu.regs = map[*Registration]struct{}{}
	o.mu.subs = map[*Subscription]struct{}{}
	o.refuse = make(chan struct{})
}

// beginRegister admits one Register call, or refuses it once Close began.
func (c *Client) beginRegister() error {
	c.own.mu.Lock()
	defer c.own.mu.Unlock()
	if c.own.mu.closed {
		return ErrClosed
	}
	c.own.starting.Add(1)
	return nil
}

func (c *Client) adoptRegistration(r *Registration) {
	c.own.mu.Lock()
	defer c.own.mu.Unlock()
	c.own.mu.regs[r] = struct{}{}
}

func (c *Client) forgetRegistration(r *Registration) {
	c.own.mu.Lock()
	defer c.own.mu.Unlock()
	delete(c.own.mu.regs, r)
}

// adoptSubscription makes s the Client's to stop on Close; s.cancel must
// be set. It fails once Close began.
func (c *Client) adoptSubscription(s *Subscription) error {
	c.own.mu.Lock()
	defer c.own.mu.Unlock()
	if c.own.mu.closed {
		return ErrClosed
	}
	c.own.mu.subs[s] = struct{}{}
	return nil
}

// forgetSubscription is called by s's goroutine as it ends.
func (c *Client) forgetSubscription(s *Subscription) {
	c.own.mu.Lock()
	defer c.own.mu.Unlock()
	delete(c.own.mu.subs, s)
}

// refuseClosed fails every unary call once the Client closed.
func (c *Client) refuseClosed(ctx context.Context, method string, req, reply any, cc *grpc.ClientConn, invoker grpc.UnaryInvoker, opts ...grpc.CallOption) error {
	select {
	case <-c.own.refuse:
		return fmt.Errorf("%s: %w", method, ErrClosed)
	default:
	}
	return invoker(ctx, method, req, reply, cc, opts...)
}

// refuseClosedStream fails every stream once the Client closed.
func (c *Client) refuseClosedStream(ctx context.Context, desc *grpc.StreamDesc, cc *grpc.ClientConn, method string, streamer grpc.Streamer, opts ...grpc.CallOption) (grpc.ClientStream, error) {
	select {
	case <-c.own.refuse:
		return nil, fmt.Errorf("%s: %w", method, ErrClosed)
	default:
	}
	return streamer(ctx, desc, cc, method, opts...)
}

// Close stops everything the Client made and closes its connections, in
// this order, waiting for each step:
//
//  1. Register, Subscribe and the resolver builder refuse new work with
//     ErrClosed; a Register still retrying its first registration stops;
//     the resolvers' linger timers are stopped (one already firing is
//     waited for).
//  2. Every open Registration is closed as Registration.Close does, all
//     at once: DRAINING, the drain grace, then deregistered. Registrations
//     go first because they need the connections, and so that the
//     Client's subscriptions (and the channels its resolvers feed) keep
//     serving fresh lists while the instances drain. Each is bounded by
//     Config.CloseTimeout, plus the lease TTL for a deregister the
//     regnodes do not answer (the record then expires with its lease).
//  3. Every Subscription, those shared by resolvers included, is stopped
//     and its goroutines waited for, as Subscription.Close does; resolvers
//     built from the Client then get no further updates, and no callback
//     starts. A callback already running is not waited for (see
//     Subscription.Close): that Subscription's Done is closed once it
//     returns.
//  4. The connections are closed; any later call through API() returns
//     ErrClosed.
//
// Afterwards no goroutine of the Client runs but a callback that was
// running when its Subscription stopped. Close is idempotent; later calls
// return the first call's result: the registrations' errors joined with
// the connections'. A Subscription's callback may call it (it does not
// wait for callbacks); a Registration's OnChange must not.
func (c *Client) Close() error {
	c.own.closeOnce.Do(func() { c.own.closeErr = c.close() })
	return c.own.closeErr
}

func (c *Client) close() error {
	// 1. Refuse new work.
	c.own.mu.Lock()
	c.own.mu.closed = true
	c.own.mu.Unlock()
	c.sharedMu.Lock()
	c.closed = true
	for k, sh := range c.shared {
		if sh.timer != nil && sh.timer.Stop() {
			c.own.lingers.Done()
		}
		delete(c.shared, k)
	}
	c.sharedMu.Unlock()
	c.cancel()
	c.own.starting.Wait()
	c.own.lingers.Wait()

	c.own.mu.Lock()
	regs := make([]*Registration, 0, len(c.own.mu.regs))
	for r := range c.own.mu.regs {
		regs = append(regs, r)
	}
	c.own.mu.Unlock()

	// 2. Registrations, at once, bounded.
	ctx, cancel := context.WithTimeout(context.Background(), c.closeTimeout)
	defer cancel()
	errs := make([]error, len(regs))
	var wg sync.WaitGroup
	for i, r := range regs {
		wg.Go(func() { errs[i] = r.Close(ctx) })
	}
	wg.Wait()

	// 3. Subscriptions: all told to stop, then each waited for.
	c.own.mu.Lock()
	subs := make([]*Subscription, 0, len(c.own.mu.subs))
	for s := range c.own.mu.subs {
		subs = append(subs, s)
	}
	c.own.mu.Unlock()
	for _, s := range subs {
		s.cancel()
	}
	for _, s := range subs {
		<-s.halted
	}
	if c.mux != nil {
		c.mux.close() // the one Subscribe stream, now carrying nothing
	}

	// 4. The connections.
	close(c.own.refuse)
	errs = append(errs, c.cc.Close())
	return errors.Join(errs...)
}
