package leasepool

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"sync"
	"time"

	pb "go.etcd.io/etcd/api/v3/etcdserverpb"
	clientv3 "go.etcd.io/etcd/client/v3"
)

// Renewer renews leases on demand, each Renew one request on ONE long-lived
// etcd LeaseKeepAlive stream shared by every caller.
//
// clientv3 offers KeepAliveOnce, which opens a new stream per renewal, and
// KeepAlive, which multiplexes leases on one stream but renews on its own
// schedule (every TTL/3, checked every 500 ms) for as long as its context
// lives, with no way to renew now and learn the outcome. A registry renews
// only when its client asks (so an instance that stops asking expires), so
// the Renewer drives the raw pb.LeaseClient stream itself: a request is
// sent at once and its answer is matched back to the caller by lease ID.
// etcd answers a LeaseKeepAlive stream in request order, one answer per
// request, so waiters for one ID are served first in, first out.
//
// The stream is opened on the first Renew and again on the first Renew
// after it broke; it requires an etcd leader, so a member cut off from its
// cluster fails renewals (Unavailable) instead of holding them.
// Safe for concurrent use.
type Renewer struct {
	cli *clientv3.Client
	log *slog.Logger

	ctx    context.Context // ends with Close: the stream's lifetime
	cancel context.CancelFunc
	reqs   chan renewReq
	wg     sync.WaitGroup

	mu      sync.Mutex
	waiters map[int64][]chan renewResult // by lease ID, in the order sent
}

type renewReq struct {
	id int64
	ch chan renewResult
}

type renewResult struct {
	ttl int64
	err error
}

// NewRenewer returns a Renewer on cli's connection; Close stops it. A nil
// logger means slog.Default().
func NewRenewer(cli *clientv3.Client, log *slog.Logger) *Renewer {
	if log == nil {
		log = slog.Default()
	}
	ctx, cancel := context.WithCancel(context.Background())
	r := &Renewer{cli: cli, log: log, ctx: ctx, cancel: cancel,
		reqs: make(chan renewReq, 1024), waiters: map[int64][]chan renewResult{}}
	r.wg.Add(1)
	go r.run()
	return r
}

// Renew renews lease id once and returns its new remaining TTL in seconds
// (the lease's full TTL). A lease etcd does not know returns ErrNotFound;
// a broken stream or a closed Renewer returns an error, and the next Renew
// opens a new stream.
func (r *Renewer) Renew(ctx context.Context, id int64) (int64, error) {
	ch := make(chan renewResult, 1) // the answer never blocks the stream's reader
	select {
	case r.reqs <- renewReq{id: id, ch: ch}:
	case <-ctx.Done():
		return 0, fmt.Errorf("renew lease %x: %w", id, ctx.Err())
	case <-r.ctx.Done():
		return 0, fmt.Errorf("renew lease %x: %w", id, ErrClosed)
	}
	select {
	case res := <-ch:
		if res.err != nil {
			return 0, fmt.Errorf("renew lease %x: %w", id, res.err)
		}
		if res.ttl <= 0 {
			return 0, fmt.Errorf("renew lease %x: %w", id, ErrNotFound)
		}
		return res.ttl, nil
	case <-ctx.Done():
		return 0, fmt.Errorf("renew lease %x: %w", id, ctx.Err())
	case <-r.ctx.Done():
		return 0, fmt.Errorf("renew lease %x: %w", id, ErrClosed)
	}
}

// Close ends the stream and fails renewals waiting on it. Idempotent.
func (r *Renewer) Close() {
	r.cancel()
	r.wg.Wait()
}

// run owns the stream: it opens it for the first request, sends every
// request on it, and after it breaks opens a new one for the next request.
func (r *Renewer) run() {
	defer r.wg.Done()
	defer r.failAll(ErrClosed, true)
	backoff := 50 * time.Millisecond
	for {
		var first renewReq
		select {
		case first = <-r.reqs:
		case <-r.ctx.Done():
			return
		}
		err := r.serve(first)
		if r.ctx.Err() != nil {
			return
		}
		r.log.Debug("lease keepalive stream ended; the next renewal opens another", "err", err)
		// A stream that cannot even open (no leader, auth) must not spin:
		// requests queued meanwhile wait for the next one, bounded by
		// their callers' contexts.
		t := time.NewTimer(backoff)
		select {
		case <-t.C:
		case <-r.ctx.Done():
			t.Stop()
			return
		}
		backoff = min(2*backoff, 2*time.Second)
		if err == nil {
			backoff = 50 * time.Millisecond
		}
	}
}

// serve opens a stream, sends first and every later request on it until
// it breaks, and fails the requests it left unanswered. It returns nil if
// the stream answered at least once (a healthy stream that broke later).
func (r *Renewer) serve(first renewReq) error {
	sctx, cancel := context.WithCancel(clientv3.WithRequireLeader(r.ctx))
	defer cancel()
	stream, err := pb.NewLeaseClient(r.cli.ActiveConnection()).LeaseKeepAlive(sctx)
	if err != nil {
		err = fmt.Errorf("open lease keepalive stream: %w", err)
		first.ch <- renewResult{err: err}
		return err
	}
	recvDone := make(chan error, 1)
	answered := false
	go func() {
		for {
			resp, err := stream.Recv()
			if err != nil {
				recvDone <- err
				return
			}
			r.mu.Lock()
			answered = true
			q := r.waiters[resp.ID]
			if len(q) > 0 {
				q[0] <- renewResult{ttl: resp.TTL}
				if len(q) == 1 {
					delete(r.waiters, resp.ID)
				} else {
					r.waiters[resp.ID] = q[1:]
				}
			}
			r.mu.Unlock()
		}
	}()
	send := func(req renewReq) error {
		r.mu.Lock()
		r.waiters[req.id] = append(r.waiters[req.id], req.ch)
		r.mu.Unlock()
		return stream.Send(&pb.LeaseKeepAliveRequest{ID: req.id})
	}
	var recvErr error
	received := false
	err = send(first)
	for err == nil {
		select {
		case req := <-r.reqs:
			err = send(req)
		case recvErr = <-recvDone:
			received, err = true, recvErr
		case <-r.ctx.Done():
			err = ErrClosed
		}
	}
	cancel()
	if !received {
		recvErr = <-recvDone // the reader has stopped: no answer races the cleanup
	}
	if errors.Is(err, ErrClosed) {
		recvErr = ErrClosed
	} else if recvErr == nil || errors.Is(recvErr, context.Canceled) {
		recvErr = err // the send failed first
	}
	r.failAll(fmt.Errorf("lease keepalive stream: %w", recvErr), false)
	r.mu.Lock()
	ok := answered
	r.mu.Unlock()
	if ok {
		return nil
	}
	return recvErr
}

// failAll answers every request sent and not answered with err; with
// drain, also those still queued (the Renewer is closing).
func (r *Renewer) failAll(err error, drain bool) {
	r.mu.Lock()
	for id, q := range r.waiters {
		for _, ch := range q {
			ch <- renewResult{err: err}
		}
		delete(r.waiters, id)
	}
	r.mu.Unlock()
	for drain {
		select {
		case req := <-r.reqs:
			req.ch <- renewResult{err: err}
		default:
			return
		}
	}
}
