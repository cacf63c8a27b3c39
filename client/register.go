package client

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"sync/atomic"
	"time"

	"google.golang.org/protobuf/types/known/durationpb"

	"github.com/regcluster/registry/lease"
	registryv1 "github.com/regcluster/registry/proto/registry/v1"
)

// RegisterOptions tune a registration. A zero field takes the default
// its comment states (DefaultRegisterOptions has them all); Register
// refuses what Validate refuses.
type RegisterOptions struct {
	// TTL is the lease TTL, record.MinTTL..record.MaxTTL (0:
	// record.DefaultTTL, 10s): how long the instance outlives a process
	// that died without deregistering. It is renewed every TTL/3.
	TTL time.Duration
	// DrainGrace is the longest Close waits for subscribers to apply the
	// drain before deleting the record (0: 2s; negative is refused).
	DrainGrace time.Duration
	// OnChange is called when the instance becomes registered, is lost, or
	// is registered again; it must not block.
	OnChange func(RegistrationStatus)
}

// RegistrationStatus is a registration's state at one moment.
type RegistrationStatus struct {
	// Registered is true while the instance is known to be in the
	// registry under a live lease: set on a successful register or
	// renewal, cleared when the lease is reported lost or has not been
	// renewed for a whole TTL.
	Registered bool
	// LeaseID is the current (or last) lease.
	LeaseID int64
	// TTL is the lease TTL the regnode granted.
	TTL time.Duration
	// Closed is true once Close has deregistered the instance, so an
	// OnChange callback can tell a graceful end from a lost lease.
	Closed bool
	// Since is when Registered last changed.
	Since time.Time
	// Registrations counts successful registrations, the first included.
	Registrations int
	// LastError is the last failure, nil after a success.
	LastError error
}

// registrationStatus is the SDK's copy of the keeper's status, so that
// the SDK's API does not expose package lease.
func registrationStatus(st lease.Status) RegistrationStatus {
	return RegistrationStatus{Registered: st.Registered, LeaseID: st.LeaseID, TTL: st.TTL, Closed: st.Closed,
		Since: st.Since, Registrations: st.Registrations, LastError: st.LastError}
}

// Registration is one instance kept registered through regnode. It keeps
// the instance alive through the loss of a regnode (any regnode serves the
// renewal) and through the loss of its lease (it registers again). It
// owns the instance: the registration's secret, which renewals, a
// re-registration and Close prove ownership with, lives only in its
// memory and is never shown. The Client that made it closes it on
// Client.Close if it is still open.
type Registration struct {
	c *Client
	k *lease.Keeper
	b *apiBackend
}

// Register registers inst and keeps it registered until Close (its own
// or the Client's). The first registration is retried until ctx ends or
// the Client closes (ErrClosed); invalid input (record.ErrInvalid) and an
// id alive under another owner (record.ErrAlreadyExists) fail at once.
func (c *Client) Register(ctx context.Context, inst *registryv1.Instance, opts RegisterOptions) (*Registration, error) {
	if err := opts.Validate(); err != nil {
		return nil, fmt.Errorf("register %s/%s: %w", inst.GetService(), inst.GetId(), err)
	}
	if err := c.beginRegister(); err != nil {
		return nil, fmt.Errorf("register %s/%s: %w", inst.GetService(), inst.GetId(), err)
	}
	defer c.own.starting.Done()
	ctx, cancel := context.WithCancel(ctx)
	defer cancel()
	defer context.AfterFunc(c.ctx, cancel)() // Close ends the retries
	b := &apiBackend{api: c.api}
	var onChange func(lease.Status)
	if opts.OnChange != nil {
		onChange = func(st lease.Status) { opts.OnChange(registrationStatus(st)) }
	}
	k, err := lease.Start(ctx, b, inst, lease.Config{
		TTL: opts.TTL, DrainGrace: opts.DrainGrace, OnChange: onChange, Logger: c.log,
	})
	if err != nil {
		b.close()
		if c.ctx.Err() != nil {
			return nil, fmt.Errorf("register %s/%s: %w (last error: %w)", inst.GetService(), inst.GetId(), ErrClosed, err)
		}
		return nil, err
	}
	r := &Registration{c: c, k: k, b: b}
	c.adoptRegistration(r)
	return r, nil
}

// Status is the registration's current state; Status().Registered says
// whether the instance is in the registry right now.
func (r *Registration) Status() RegistrationStatus { return registrationStatus(r.k.Status()) }

// Instance is the record as this registration writes it.
func (r *Registration) Instance() *registryv1.Instance { return r.k.Instance() }

// Drain marks the instance DRAINING: callers stop sending it new
// requests. After Close it returns ErrClosed.
func (r *Registration) Drain(ctx context.Context, reason string) error {
	return closedAs(r.k.Drain(ctx, reason))
}

// Serve marks the instance SERVING (after STARTING, or to undo Drain).
// After Close it returns ErrClosed.
func (r *Registration) Serve(ctx context.Context) error { return closedAs(r.k.Serve(ctx)) }

// closedAs reports the keeper's ErrClosed as the SDK's.
func closedAs(err error) error {
	if errors.Is(err, lease.ErrClosed) {
		return ErrClosed
	}
	return err
}

// Close drains, waits until every live subscriber of the service on every
// regnode applied the drain (or the drain grace passes, whichever is
// first), then deregisters and revokes the lease. It is idempotent;
// Client.Close calls it for a Registration still open.
func (r *Registration) Close(ctx context.Context) error {
	err := r.k.Close(ctx)
	r.b.close()
	r.c.forgetRegistration(r)
	return err
}

// apiBackend is lease.Backend over regnode's API. Renewals share one
// KeepAlive stream, reopened (on whichever regnode is up) after it breaks.
type apiBackend struct {
	api registryv1.RegistryClient

	mu     sync.Mutex
	stream registryv1.Registry_KeepAliveClient
	cancel context.CancelFunc
	secret atomic.Pointer[string] // the registration's, once granted: its drain is the owner's

	drainMu  sync.Mutex
	drainRev map[string]int64 // service/id: the revision of its last DRAINING write
}

func (b *apiBackend) Register(ctx context.Context, inst *registryv1.Instance, ttl time.Duration, secret string) (lease.Grant, error) {
	resp, err := b.api.Register(ctx, &registryv1.RegisterRequest{Instance: inst, Ttl: durationpb.New(ttl), Secret: secret})
	if err != nil {
		return lease.Grant{}, fmt.Errorf("register %s/%s: %w", inst.GetService(), inst.GetId(), FromStatus(err))
	}
	b.secret.Store(&resp.Secret)
	return lease.Grant{LeaseID: resp.LeaseId, TTL: time.Duration(resp.TtlSeconds) * time.Second, Revision: resp.Revision, Secret: resp.Secret}, nil
}

func (b *apiBackend) KeepAlive(ctx context.Context, o lease.Owner) (time.Duration, error) {
	leaseID := o.LeaseID
	b.mu.Lock()
	defer b.mu.Unlock()
	if b.stream == nil {
		// The stream outlives this call, but opening it is bounded by
		// the call: grpc may wait for a regnode to pick (all of them
		// stalled or paused), and a renewal must not wait past its ctx.
		sctx, cancel := context.WithCancel(context.Background())
		stopOpen := context.AfterFunc(ctx, cancel)
		s, err := b.api.KeepAlive(sctx)
		if !stopOpen() || err != nil {
			cancel()
			if err == nil || ctx.Err() != nil {
				err = ctx.Err()
			}
			return 0, fmt.Errorf("open keepalive stream: %w", FromStatus(err))
		}
		b.stream, b.cancel = s, cancel
	}
	// The stream outlives one call; a call whose ctx ends breaks it.
	stop := context.AfterFunc(ctx, b.cancel)
	defer stop()
	resp, err := b.roundTrip(&registryv1.KeepAliveRequest{LeaseId: leaseID, Service: o.Service, Id: o.ID, Secret: o.Secret})
	if err != nil {
		b.cancel()
		b.stream, b.cancel = nil, nil
		if ctx.Err() != nil {
			err = ctx.Err()
		}
		return 0, fmt.Errorf("keep lease %x alive: %w", leaseID, FromStatus(err))
	}
	if resp.Lost {
		return 0, fmt.Errorf("keep lease %x alive: %w", leaseID, lease.ErrLeaseLost)
	}
	return time.Duration(resp.TtlSeconds) * time.Second, nil
}

func (b *apiBackend) roundTrip(req *registryv1.KeepAliveRequest) (*registryv1.KeepAliveResponse, error) {
	if err := b.stream.Send(req); err != nil {
		return nil, err
	}
	return b.stream.Recv()
}

func (b *apiBackend) SetLifecycle(ctx context.Context, service, id string, lc registryv1.Lifecycle, reason string) error {
	var sec string
	if p := b.secret.Load(); p != nil {
		sec = *p
	}
	var err error
	switch lc {
	case registryv1.Lifecycle_LIFECYCLE_DRAINING:
		var resp *registryv1.DrainResponse
		if resp, err = b.api.Drain(ctx, &registryv1.DrainRequest{Service: service, Id: id, Reason: reason, Secret: sec}); err == nil {
			b.drainMu.Lock()
			if b.drainRev == nil {
				b.drainRev = map[string]int64{}
			}
			b.drainRev[service+"/"+id] = resp.Revision
			b.drainMu.Unlock()
		}
	case registryv1.Lifecycle_LIFECYCLE_SERVING:
		_, err = b.api.Undrain(ctx, &registryv1.UndrainRequest{Service: service, Id: id, Secret: sec})
	default:
		return fmt.Errorf("set %s/%s to %s: only DRAINING and SERVING can be set after registering", service, id, lc)
	}
	if err != nil {
		return fmt.Errorf("set %s/%s to %s: %w", service, id, lc, FromStatus(err))
	}
	return nil
}

// WaitDrained asks the regnodes (WaitApplied) until every live subscriber
// of service has applied the last drain of service/id, until ctx ends.
func (b *apiBackend) WaitDrained(ctx context.Context, service, id string) error {
	b.drainMu.Lock()
	rev := b.drainRev[service+"/"+id]
	b.drainMu.Unlock()
	if rev == 0 {
		return fmt.Errorf("wait for the drain of %s/%s: no drain written by this registration", service, id)
	}
	deadline, ok := ctx.Deadline()
	if !ok {
		return fmt.Errorf("wait for the drain of %s/%s: no deadline", service, id)
	}
	for {
		// The regnode answers at the timeout; the call ends with ctx.
		left := time.Until(deadline)
		if left <= 0 {
			return fmt.Errorf("wait for the drain of %s/%s at revision %d: %w", service, id, rev, context.DeadlineExceeded)
		}
		// The regnode answers at its timeout: a little before ours, so
		// that its answer (who is behind) arrives.
		resp, err := b.api.WaitApplied(ctx, &registryv1.WaitAppliedRequest{Service: service, Revision: rev, Timeout: durationpb.New(left * 9 / 10)})
		if err != nil {
			return fmt.Errorf("wait for the drain of %s/%s at revision %d: %w", service, id, rev, FromStatus(err))
		}
		if resp.Done {
			return nil
		}
		if ctx.Err() != nil || time.Until(deadline) < 100*time.Millisecond {
			return fmt.Errorf("wait for the drain of %s/%s at revision %d: %d of %d live subscribers have not applied it", service, id, rev, resp.Pending, resp.Subscribers)
		}
		// A regnode that could not be asked answers at once: ask again
		// soon, not in a tight loop.
		t := time.NewTimer(100 * time.Millisecond)
		select {
		case <-t.C:
		case <-ctx.Done():
			t.Stop()
		}
	}
}

func (b *apiBackend) Deregister(ctx context.Context, o lease.Owner) error {
	if _, err := b.api.Deregister(ctx, &registryv1.DeregisterRequest{Service: o.Service, Id: o.ID, LeaseId: o.LeaseID, Secret: o.Secret}); err != nil {
		return fmt.Errorf("deregister %s/%s: %w", o.Service, o.ID, FromStatus(err))
	}
	return nil
}

func (b *apiBackend) close() {
	b.mu.Lock()
	defer b.mu.Unlock()
	if b.cancel != nil {
		b.cancel()
		b.stream, b.cancel = nil, nil
	}
}
