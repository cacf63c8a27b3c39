// Package client is the Go SDK of the registry: it talks to any of a list of
// regnodes and survives the loss of the one it talks to. Register keeps an
// instance registered (renewing, re-registering after a lost lease,
// draining before it deletes) with the same guarantees as package lease,
// whose loop it reuses over regnode's API.
package client

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"strings"
	"sync"
	"sync/atomic"

	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/credentials/insecure"
	"google.golang.org/grpc/resolver"
	"google.golang.org/grpc/resolver/manual"
	"google.golang.org/grpc/status"

	"github.com/regcluster/registry/internal/chunk"
	registryv1 "github.com/regcluster/registry/proto/registry/v1"
	"github.com/regcluster/registry/record"
)

// DefaultEndpoint is where a regnode listens unless told otherwise.
const DefaultEndpoint = "127.0.0.1:7400"

// Config says which regnodes to use and how.
type Config struct {
	// Endpoints are regnode API addresses (host:port); calls go to any
	// that is up (default DefaultEndpoint).
	Endpoints []string
	// Logger (default slog.Default()).
	Logger *slog.Logger
	// DialOptions are added to the defaults (insecure transport,
	// round robin over Endpoints).
	DialOptions []grpc.DialOption
}

// Client is a connection to the regnodes of one registry. It is safe for
// concurrent use; Close it when done.
type Client struct {
	cc     *grpc.ClientConn
	api    registryv1.RegistryClient
	log    *slog.Logger
	ctx    context.Context // ends on Close: the lifetime of shared subscriptions
	cancel context.CancelFunc

	endpoints int // how many regnodes Endpoints names

	sharedMu sync.Mutex
	shared   map[string]*shared
	closed   bool
}

var errClientClosed = errors.New("registry client closed")

var schemeSeq atomic.Int64

// New returns a Client of cfg.Endpoints. It does not wait for a regnode to
// be reachable: calls fail (or wait, with grpc.WaitForReady) until one is.
func New(cfg Config) (*Client, error) {
	eps := cfg.Endpoints
	if len(eps) == 0 {
		eps = []string{DefaultEndpoint}
	}
	addrs := make([]resolver.Address, 0, len(eps))
	for _, ep := range eps {
		ep = strings.TrimSpace(ep)
		if err := record.ValidAddress(ep); err != nil {
			return nil, fmt.Errorf("endpoint %q is not host:port: %w", ep, err)
		}
		addrs = append(addrs, resolver.Address{Addr: ep})
	}
	// A resolver of our own fixed list: grpc-go has none built in for
	// several static addresses, and manual.Resolver is its supported one.
	r := manual.NewBuilderWithScheme(fmt.Sprintf("regnodes-%d", schemeSeq.Add(1)))
	r.InitialState(resolver.State{Addresses: addrs})
	opts := append([]grpc.DialOption{
		grpc.WithTransportCredentials(insecure.NewCredentials()),
		grpc.WithResolvers(r),
		grpc.WithDefaultServiceConfig(`{"loadBalancingConfig":[{"round_robin":{}}]}`),
		// Every regnode message is at most chunk.MaxBytes (watch chunks,
		// list pages); RecvLimit leaves room for a regnode that frames
		// differently.
		grpc.WithDefaultCallOptions(grpc.MaxCallRecvMsgSize(chunk.RecvLimit)),
	}, cfg.DialOptions...)
	cc, err := grpc.NewClient(r.Scheme()+":///regnodes", opts...)
	if err != nil {
		return nil, fmt.Errorf("connect to regnodes %v: %w", eps, err)
	}
	log := cfg.Logger
	if log == nil {
		log = slog.Default()
	}
	ctx, cancel := context.WithCancel(context.Background())
	return &Client{cc: cc, api: registryv1.NewRegistryClient(cc), log: log, ctx: ctx, cancel: cancel,
		endpoints: len(eps), shared: map[string]*shared{}}, nil
}

// API is the raw registry.v1 client, for calls the SDK does not wrap.
func (c *Client) API() registryv1.RegistryClient { return c.api }

// Close stops the subscriptions shared by resolvers and closes the
// connections. Registrations and subscriptions made through the Client
// should be closed first.
func (c *Client) Close() error {
	c.sharedMu.Lock()
	c.closed = true
	subs := make([]*Subscription, 0, len(c.shared))
	for k, sh := range c.shared {
		if sh.timer != nil {
			sh.timer.Stop()
		}
		subs = append(subs, sh.sub)
		delete(c.shared, k)
	}
	c.sharedMu.Unlock()
	c.cancel()
	for _, s := range subs {
		s.Close()
	}
	return c.cc.Close()
}

// FromStatus turns a regnode error into one that wraps the sentinel a
// caller branches on (record.ErrInvalid, record.ErrNotFound,
// record.ErrAlreadyExists), keeping the message. A lost lease is not an
// error of the API: KeepAlive answers it with lost=true.
func FromStatus(err error) error {
	if err == nil {
		return nil
	}
	st, ok := status.FromError(err)
	if !ok {
		return err
	}
	var sentinel error
	switch st.Code() {
	case codes.InvalidArgument:
		sentinel = record.ErrInvalid
	case codes.NotFound:
		sentinel = record.ErrNotFound
	case codes.AlreadyExists:
		sentinel = record.ErrAlreadyExists
	}
	if sentinel == nil {
		return err
	}
	return &statusError{sentinel: sentinel, err: err}
}

type statusError struct {
	sentinel error
	err      error
}

func (e *statusError) Error() string { return e.err.Error() }

// Is matches the sentinel; Unwrap keeps the gRPC status reachable.
func (e *statusError) Is(target error) bool { return errors.Is(e.sentinel, target) }
func (e *statusError) Unwrap() error        { return e.err }

// GRPCStatus lets status.FromError see through the wrapper.
func (e *statusError) GRPCStatus() *status.Status { s, _ := status.FromError(e.err); return s }
