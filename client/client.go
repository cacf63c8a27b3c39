// Package client is the Go SDK of the registry: it talks to any of a list of
// regnodes and survives the loss of the one it talks to. Register keeps an
// instance registered (renewing, re-registering after a lost lease,
// draining before it deletes) with the same guarantees as package lease,
// whose loop it reuses over regnode's API.
package client

import (
	"context"
	"crypto/tls"
	"errors"
	"fmt"
	"log/slog"
	"os"
	"sync"
	"sync/atomic"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/backoff"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/credentials"
	"google.golang.org/grpc/credentials/insecure"
	"google.golang.org/grpc/keepalive"
	"google.golang.org/grpc/resolver"
	"google.golang.org/grpc/resolver/manual"
	"google.golang.org/grpc/status"

	"github.com/regcluster/registry/balance"
	"github.com/regcluster/registry/internal/chunk"
	"github.com/regcluster/registry/lastresort"
	registryv1 "github.com/regcluster/registry/proto/registry/v1"
	"github.com/regcluster/registry/record"
)

// DefaultEndpoint is where a regnode listens unless told otherwise.
const DefaultEndpoint = "127.0.0.1:7400"

// Config says which regnodes to use and how. The zero Config is valid: a
// zero field takes the default its comment states (DefaultConfig has them
// all), and New refuses what Validate refuses (errors wrap
// ErrInvalidConfig).
type Config struct {
	// Endpoints are regnode API addresses (host:port, spaces trimmed);
	// calls go to any that is up (empty: DefaultEndpoint).
	Endpoints []string
	// Logger (nil: slog.Default()).
	Logger *slog.Logger
	// TLS, if set, is the transport security of the connections to the
	// regnodes (its RootCAs the CA of their certificates, its
	// Certificates or GetClientCertificate the client certificate when
	// they ask for one); each endpoint's host is the name checked unless
	// TLS.ServerName says otherwise. Nil: plaintext.
	TLS *tls.Config
	// Token, if set, is sent on every call to the regnodes (regnode
	// --auth) as per-RPC credentials, "authorization: Bearer <token>".
	// New refuses it over plaintext (TLS nil) to an endpoint off this
	// host, where anyone on the path could read and replay it, unless
	// AllowInsecureToken.
	Token string
	// AllowInsecureToken lets Token be sent in plaintext to endpoints off
	// this host (a network you trust end to end).
	AllowInsecureToken bool
	// DialOptions are added to the defaults (transport per TLS, round
	// robin over Endpoints that steers a resuming subscription off a
	// stalled regnode, keepalive pings) and win over them.
	DialOptions []grpc.DialOption

	// Policy is the balancing and retry policy of the channels to every
	// service not in Policies (nil: DefaultPolicy()); it must pass
	// Policy.Validate.
	Policy *Policy
	// Policies are the policies of named services: each key a valid
	// service name, each policy passing Policy.Validate.
	Policies map[string]Policy
	// Zone is the caller's zone: channels prefer instances of this zone
	// while it has enough healthy capacity, and spill over to the others
	// otherwise (see package balance). "" routes without regard to zones.
	Zone string

	// CacheDir, if set, keeps each service's last-known-good view on disk
	// (a subscription of every service, Subscribe(ctx, "", ...), keeps none)
	// (<CacheDir>/<service>.lkg, written atomically at most once a second
	// and on Close): a subscription that starts while no regnode answers
	// serves it (Freshness.FromDisk) until the first live snapshot
	// replaces it. Loading it never delays subscribing. The directory is
	// created if absent. "" keeps nothing on disk.
	CacheDir string
	// CacheMaxAge is the age past which a disk view is ignored, with a
	// warning (0: DefaultCacheMaxAge; negative is refused).
	CacheMaxAge time.Duration

	// ConnectTimeout is how long a registry:/// channel whose first view
	// has not come waits for a regnode to answer (0:
	// DefaultConnectTimeout; negative is refused). Until then the channel
	// is CONNECTING and its calls wait, fail-fast or not, within their
	// deadlines; past it, with no regnode answering and no disk view, it
	// is TRANSIENT_FAILURE: fail-fast calls fail at once ("registry not
	// reached yet and no cached list") and wait-for-ready calls keep
	// waiting. A view once known keeps serving whatever happens after.
	ConnectTimeout time.Duration

	// LastResort says when and for how long a registry:/// channel keeps
	// calling the instances of its service that vanished by lease expiry
	// (an etcd stall, restore or partition, not a deregistration or a
	// drain): see package lastresort and docs/sdk.md. A zero field takes
	// lastresort.DefaultConfig's value. Its OnStart and OnEnd are not
	// called: the Client logs, counts (Metrics) and shows (Freshness) the
	// last resort itself.
	LastResort lastresort.Config

	// ReportInterval is how often the Client reports, on its Subscribe
	// stream, what its registry:/// channels' calls saw of each instance
	// (instance-level failures and successes, as ejection classifies
	// them; never application codes), so that the registry can tell an
	// instance that fails its callers while passing its probes (0:
	// DefaultReportInterval; negative: never report).
	ReportInterval time.Duration

	// CloseTimeout bounds how long Close gives the open Registrations to
	// drain and deregister (0: DefaultCloseTimeout; negative is refused);
	// a drain grace longer than it is cut short.
	CloseTimeout time.Duration
	// Subscriber names this client to the regnodes (in the answer of a
	// drain waiting for subscribers); "": "<host>/<pid>".
	Subscriber string
	// WatchPerSubscription makes every Subscription open a Watch stream
	// of its own, as the SDK did before the Subscribe stream (for regnodes
	// that serve no Subscribe). Default: one Subscribe stream per Client
	// carries every Subscription and resolver, and acknowledges what they
	// applied.
	WatchPerSubscription bool
}

// Policy is the balancing and retry policy of the channels to one
// service; see package balance for each field and its default.
type Policy = balance.Policy

// DefaultPolicy returns the policy used when Config names none.
func DefaultPolicy() Policy { return balance.DefaultPolicy() }

// Client is a connection to the regnodes of one registry. It is safe for
// concurrent use; Close it when done.
type Client struct {
	cc     *grpc.ClientConn
	api    registryv1.RegistryClient
	log    *slog.Logger
	ctx    context.Context // ends when Close begins: stops first registrations still retrying
	cancel context.CancelFunc

	policy   Policy
	policies map[string]Policy
	metrics  *balance.Metrics
	zone     string

	endpoints int // how many regnodes Endpoints names

	cacheDir    string // Config.CacheDir
	cacheMaxAge time.Duration

	lastResort lastresort.Config // Config.LastResort, hooks cleared

	connectTimeout time.Duration // Config.ConnectTimeout
	reportInterval time.Duration // Config.ReportInterval

	mux        *mux   // the Subscribe stream (mux.go), nil with WatchPerSubscription
	subscriber string // Config.Subscriber

	sharedMu sync.Mutex
	shared   map[string]*shared
	closed   bool

	closeTimeout time.Duration // Config.CloseTimeout
	own          owned         // what Close stops (own.go)

	conns connTable // the raw sockets of the regnode connections (unread.go)
}

// clientKeepalive pings a regnode connection that has been quiet for 10s
// (grpc-go's floor for clients; regnode permits 5s) and drops it when no
// answer comes within 3s, so a paused regnode or a half-open connection
// leaves round robin instead of taking new calls for good. A subscription
// does not wait for this: its receive deadline (SubscribeOptions) moves it
// sooner.
var clientKeepalive = keepalive.ClientParameters{Time: 10 * time.Second, Timeout: 3 * time.Second, PermitWithoutStream: true}

// regnodeWindow is the HTTP/2 flow-control window, stream and connection,
// of a Client's connection to a regnode: static, so grpc-go estimates no
// bandwidth-delay product on it. Its estimator answers the first DATA
// frame after each of its pings is acknowledged with a window update and
// a new PING. On a subscription stream, whose messages are small and
// apart (an event, a progress message each second), that is every
// message: three more frames and a write and a read more on each side,
// which at 10,000 subscribers cost the regnodes more than the messages
// themselves. 4 MiB is the most one message holds (chunk.RecvLimit), so a
// snapshot's 1 MiB chunks still flow four at a time without a wait.
const regnodeWindow = chunk.RecvLimit

var schemeSeq atomic.Int64

// New returns a Client of cfg.Endpoints. It does not wait for a regnode to
// be reachable: calls fail (or wait, with grpc.WaitForReady) until one is.
func New(cfg Config) (*Client, error) {
	if err := cfg.Validate(); err != nil {
		return nil, err
	}
	cfg = cfg.withDefaults()
	policy := *cfg.Policy
	policies := make(map[string]Policy, len(cfg.Policies))
	for svc, p := range cfg.Policies {
		policies[svc] = p
	}
	if cfg.CacheDir != "" {
		if err := os.MkdirAll(cfg.CacheDir, 0o700); err != nil {
			return nil, fmt.Errorf("Config.CacheDir: %w", err)
		}
	}
	eps := cfg.Endpoints
	addrs := make([]resolver.Address, 0, len(eps))
	for _, ep := range eps {
		a := resolver.Address{Addr: ep}
		if cfg.TLS != nil {
			// The name checked against the certificate is the endpoint's
			// host, not the "regnodes" of the channel's target.
			a.ServerName = ep
		}
		addrs = append(addrs, a)
	}
	c := &Client{log: cfg.Logger, policy: policy, policies: policies, metrics: balance.NewMetrics(), zone: cfg.Zone,
		endpoints: len(eps), shared: map[string]*shared{}, cacheDir: cfg.CacheDir, cacheMaxAge: cfg.CacheMaxAge, lastResort: cfg.LastResort, closeTimeout: cfg.CloseTimeout,
		connectTimeout: cfg.ConnectTimeout, reportInterval: cfg.ReportInterval,
		subscriber: cfg.Subscriber}
	c.own.init()
	creds := insecure.NewCredentials()
	if cfg.TLS != nil {
		creds = credentials.NewTLS(cfg.TLS.Clone())
	}
	if canQueryUnread {
		creds = trackingCreds{TransportCredentials: creds, t: &c.conns}
	}
	// A resolver of our own fixed list: grpc-go has none built in for
	// several static addresses, and manual.Resolver is its supported one.
	r := manual.NewBuilderWithScheme(fmt.Sprintf("regnodes-%d", schemeSeq.Add(1)))
	r.InitialState(resolver.State{Addresses: addrs})
	tokOpt, err := tokenOption(cfg, eps) // token.go
	if err != nil {
		return nil, err
	}
	opts := append([]grpc.DialOption{
		grpc.WithTransportCredentials(creds),
		grpc.WithResolvers(r),
		grpc.WithDefaultServiceConfig(`{"loadBalancingConfig":[{"` + regnodePolicy + `":{}}]}`),
		grpc.WithKeepaliveParams(clientKeepalive),
		grpc.WithConnectParams(grpc.ConnectParams{Backoff: backoff.Config{BaseDelay: connectBackoff.base,
			Multiplier: connectBackoff.multiplier, Jitter: connectBackoff.jitter, MaxDelay: connectBackoff.max},
			MinConnectTimeout: minConnectTimeout}),
		grpc.WithStaticStreamWindowSize(regnodeWindow),
		grpc.WithStaticConnWindowSize(regnodeWindow),
		// Every regnode message is at most chunk.MaxBytes (watch chunks,
		// list pages); RecvLimit leaves room for a regnode that frames
		// differently.
		grpc.WithDefaultCallOptions(grpc.MaxCallRecvMsgSize(chunk.RecvLimit)),
		// First in the chain: a closed Client sends nothing.
		grpc.WithChainUnaryInterceptor(c.refuseClosed),
		grpc.WithChainStreamInterceptor(c.refuseClosedStream),
	}, cfg.DialOptions...)
	if tokOpt != nil {
		opts = append(opts, tokOpt)
	}
	cc, err := grpc.NewClient(r.Scheme()+":///regnodes", opts...)
	if err != nil {
		return nil, fmt.Errorf("connect to regnodes %v: %w", eps, err)
	}
	c.cc, c.api = cc, registryv1.NewRegistryClient(cc)
	c.ctx, c.cancel = context.WithCancel(context.Background())
	if !cfg.WatchPerSubscription {
		c.mux = newMux(c)
	}
	return c, nil
}

// DialOptions are the options of a channel to a registered service:
//
//	cc, err := grpc.NewClient("registry:///orders", c.DialOptions()...)
//
// They give this Client's resolver, package balance's policy (the
// resolver also pushes it in the service config, with the service's
// Policy), its retry interceptors for unary calls and stream starts, and
// insecure transport credentials, which an option given after them
// replaces (grpc.WithTransportCredentials).
func (c *Client) DialOptions() []grpc.DialOption {
	sc, err := balance.ServiceConfig(c.policy)
	if err != nil { // validated in New
		panic(fmt.Sprintf("client: default policy: %v", err))
	}
	return []grpc.DialOption{
		grpc.WithTransportCredentials(insecure.NewCredentials()),
		grpc.WithResolvers(c.ResolverBuilder()),
		grpc.WithDefaultServiceConfig(sc),
		grpc.WithChainUnaryInterceptor(balance.UnaryClientInterceptor()),
		grpc.WithChainStreamInterceptor(balance.StreamClientInterceptor()),
	}
}

// policyFor returns the policy of service.
func (c *Client) policyFor(service string) Policy {
	if p, ok := c.policies[service]; ok {
		return p
	}
	return c.policy
}

// Metrics are the counts of every channel built with this Client's
// resolver: picks and weights by instance, ejections, panic mode,
// retries, budget exhaustion, disk-cache loads and the age of the disk
// views served. It is a prometheus.Collector: register it
// with the application's registry to export them (registry_client_*).
func (c *Client) Metrics() *balance.Metrics { return c.metrics }

// API is the raw registry.v1 client, for calls the SDK does not wrap.
func (c *Client) API() registryv1.RegistryClient { return c.api }

// FromStatus turns a regnode error into one that wraps the sentinel a
// caller branches on (record.ErrInvalid, record.ErrNotFound,
// record.ErrAlreadyExists), keeping the message. An InvalidArgument that
// names its field (errdetails.BadRequest) also matches *record.FieldError
// with errors.As, as the regnode's own validation failure did. A lost
// lease is not an error of the API: KeepAlive answers it with lost=true.
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
	case codes.Unauthenticated, codes.PermissionDenied:
		return deniedError{err} // token.go
	}
	if sentinel == nil {
		return err
	}
	return &statusError{sentinel: sentinel, err: err, field: fieldError(st)}
}

type statusError struct {
	sentinel error
	err      error
	field    *record.FieldError // InvalidArgument naming its field, or nil
}

func (e *statusError) Error() string { return e.err.Error() }

// Is matches the sentinel; Unwrap keeps the gRPC status reachable.
func (e *statusError) Is(target error) bool { return errors.Is(e.sentinel, target) }
func (e *statusError) Unwrap() error        { return e.err }

// GRPCStatus lets status.FromError see through the wrapper.
func (e *statusError) GRPCStatus() *status.Status { s, _ := status.FromError(e.err); return s }
