// Package node assembles one regnode: an embedded etcd member (or a client
// of an external etcd cluster), the registry.v1 API with gRPC health and
// reflection, and Prometheus metrics. Start brings it up; Close stops it
// cleanly: API streams closed, etcd closed, nothing lost.
package node

import (
	"context"
	"crypto/tls"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"net/http"
	"os"
	"strings"
	"sync"
	"time"

	"github.com/prometheus/client_golang/prometheus/promhttp"
	clientv3 "go.etcd.io/etcd/client/v3"
	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials"
	grpchealth "google.golang.org/grpc/health"
	healthpb "google.golang.org/grpc/health/grpc_health_v1"
	"google.golang.org/grpc/keepalive"
	"google.golang.org/grpc/reflection"

	"github.com/regcluster/registry/election"
	"github.com/regcluster/registry/health"
	"github.com/regcluster/registry/internal/chunk"
	"github.com/regcluster/registry/internal/configerr"
	"github.com/regcluster/registry/internal/embedded"
	"github.com/regcluster/registry/internal/fanout"
	"github.com/regcluster/registry/internal/leasepool"
	"github.com/regcluster/registry/internal/metrics"
	"github.com/regcluster/registry/internal/peerlimit"
	"github.com/regcluster/registry/internal/tlsfiles"
	"github.com/regcluster/registry/internal/txnbatch"
	"github.com/regcluster/registry/internal/zapslog"
	"github.com/regcluster/registry/probe"
	"github.com/regcluster/registry/prober"
	registryv1 "github.com/regcluster/registry/proto/registry/v1"
	"github.com/regcluster/registry/record"
	"github.com/regcluster/registry/server"
	"github.com/regcluster/registry/store"
)

// Version is the regnode version reported by Status.
const Version = "0.1.0"

// Config is everything a regnode needs. DefaultConfig gives the values of
// `regnode` with no flags.
type Config struct {
	// Listen is the API address (default 127.0.0.1:7400; port 0 picks one).
	Listen string
	// MetricsListen serves /metrics (default 127.0.0.1:7401; "off"
	// disables it; port 0 picks one).
	MetricsListen string
	// EtcdEndpoints, if set, makes this regnode a client of that external
	// etcd cluster; Embed is then ignored.
	EtcdEndpoints []string
	// Embed configures the embedded etcd member.
	Embed embedded.Config
	// Name is this regnode's name (default: the embedded member's name, or
	// the host name).
	Name string
	// Prefix is the key prefix (default /registry/v1/).
	Prefix string
	// SessionTTL is the prober election session TTL (default 10s).
	SessionTTL time.Duration
	// Logger (default slog.Default()).
	Logger *slog.Logger
	// ProbeInterval is how often the prober checks an instance whose check
	// does not say (default 1s).
	ProbeInterval time.Duration
	// ProbeTimeout bounds a probe whose check does not say (default 500ms).
	ProbeTimeout time.Duration
	// ProbeConcurrency bounds probes in flight (default 64).
	ProbeConcurrency int
	// Thresholds are the global health thresholds (default
	// health.DefaultThresholds()); an instance's check overrides them.
	Thresholds health.Thresholds
	// RingSize bounds the recent events kept for resuming subscribers
	// (default 10000).
	RingSize int
	// QueueSize bounds each subscriber's queue before it is reset
	// (default 1024).
	QueueSize int
	// ShutdownGrace bounds how long Close lets calls in flight finish
	// before closing streams (default 2s).
	ShutdownGrace time.Duration
	// Limits are the per-peer rate limits and stream caps (zero:
	// peerlimit.DefaultConfig()).
	Limits peerlimit.Config
	// MaxConcurrentStreams caps the streams (calls in flight, Watch and
	// KeepAlive streams included) of one client connection to the API
	// (--max-concurrent-streams, etcd's name; 0: DefaultMaxConcurrentStreams).
	// It is HTTP/2's SETTINGS_MAX_CONCURRENT_STREAMS: a grpc-go client
	// past it waits for a stream to end; a client that ignores it has
	// the extra stream refused (RST_STREAM REFUSED_STREAM).
	MaxConcurrentStreams uint32
	// MaxRequestBytes caps one message a client sends to the API
	// (--max-request-bytes, etcd's name; 0: DefaultMaxRequestBytes); a
	// larger one is refused by grpc-go with ResourceExhausted before it
	// is decoded.
	MaxRequestBytes int
	// MaxResponseBytes caps one message the API sends (--max-response-bytes;
	// 0: DefaultMaxResponseBytes). List pages and Watch chunks are at most
	// about chunk.MaxBytes, so it is a backstop, never met by a working
	// regnode.
	MaxResponseBytes int
	// OperatorDeregister says who may Deregister without the
	// registration's secret: "loopback" (default: callers on this host)
	// or "none".
	OperatorDeregister string

	// TLS serves the API and the HTTP port (metrics) over TLS, with etcd's
	// flags and meanings (--cert-file, --key-file, --trusted-ca-file,
	// --client-cert-auth); the files are re-read when they change (see
	// package tlsfiles), connections already made are kept.
	TLS tlsfiles.Server
	// Insecure lets a listener on a non-loopback address serve without
	// TLS; without it such a regnode refuses to start.
	Insecure bool
	// EtcdTLS is this regnode's TLS as a client of etcd (--etcd-cacert,
	// --etcd-cert, --etcd-key): of the external cluster, or of its own
	// embedded member when that serves https.
	EtcdTLS tlsfiles.Client
	// EtcdUsername and EtcdPassword authenticate this regnode to an etcd
	// with auth enabled (--etcd-username; the password from
	// --etcd-password-file or REGNODE_ETCD_PASSWORD, never a flag).
	EtcdUsername, EtcdPassword string
	// EmbedAuth turns etcd's auth on at the embedded member
	// (--etcd-server-auth), so its client port refuses clients without
	// credentials. The regnode's credential is EtcdUsername and
	// EtcdPassword if set (give every regnode of a cluster the same),
	// else user root with a password generated on the first start and
	// kept in the data dir (RootPasswordFile, mode 0600).
	EmbedAuth bool
	// GroupCommit commits concurrent Registers as one etcd Txn
	// (internal/txnbatch; --group-commit). Off by default: with it, the
	// fault suite's paused prober leader (integration
	// TestPauseProberLeader) loses an open registration's record about one
	// run in six, a violation of "a live instance comes back by itself"
	// not yet explained; without it, in the same runs, none.
	GroupCommit bool
	// Auth turns scoped tokens on (--auth): every registry.v1 call needs
	// a token whose role and scope allow it (see package token). The
	// first start writes an admin token to AdminTokenFile.
	Auth bool
	// AdminTokenFile is where the first admin token is written (default
	// <data dir>/admin-token, with an external etcd too).
	AdminTokenFile string
}

// Keepalive on the API. A subscriber whose machine vanished (or whose
// connection is half-open) holds a Watch stream and a fan-out queue until
// the transport notices: the server pings a connection idle for
// keepaliveServer.Time and closes it when no answer comes within Timeout.
// Clients ping too (package client: every 10s, grpc-go's floor); the
// policy lets them, streams or not, as often as every 5s.
var (
	keepaliveEnforcement = keepalive.EnforcementPolicy{MinTime: 5 * time.Second, PermitWithoutStream: true}
	keepaliveServer      = keepalive.ServerParameters{Time: 10 * time.Second, Timeout: 5 * time.Second}
)

// The API's message and stream limits with no flags.
//
// Requests are small: the largest is a Register of one record of at most
// record.MaxRecordSize (16 KiB) plus a secret and a TTL, so 64 KiB holds
// any valid request four times over, and a client cannot make the regnode
// buffer and decode megabytes (grpc-go's default is 4 MiB) to be told the
// record is too large. Responses are bounded by chunk.MaxBytes (1 MiB) per
// List page or Watch message; the send cap is what clients accept
// (chunk.RecvLimit, 4 MiB), instead of grpc-go's unbounded default. The
// streams of one connection are capped above the per-peer stream cap
// (4096 Watch and KeepAlive streams), leaving room for unary calls in
// flight: the SDK puts every registration's KeepAlive and every
// subscription's Watch of a process on one connection.
const (
	DefaultMaxConcurrentStreams = 5000
	DefaultMaxRequestBytes      = 64 << 10
	DefaultMaxResponseBytes     = chunk.RecvLimit
	// MinRequestBytes is the least --max-request-bytes can be: a Register
	// of a record at record.MaxRecordSize must fit, with room to spare.
	MinRequestBytes = 2 * record.MaxRecordSize
	// MinResponseBytes is the least --max-response-bytes can be: a List
	// page or Watch chunk (chunk.MaxBytes), with room to spare.
	MinResponseBytes = 2 * chunk.MaxBytes
)

// DefaultConfig is `regnode` with no flags.
func DefaultConfig() Config {
	return Config{
		Listen:        "127.0.0.1:7400",
		MetricsListen: "127.0.0.1:7401",
		Embed:         embedded.Config{Name: "default", Dir: "regnode.data"},
		Prefix:        record.DefaultPrefix,
		SessionTTL:    10 * time.Second,
		ShutdownGrace: 2 * time.Second,
		ProbeInterval: time.Second,
		ProbeTimeout:  500 * time.Millisecond,
		// Zero values keep working (each component fills its own
		// default); these are the same, stated once so the flags show them.
		ProbeConcurrency: 64,
		RingSize:         10000,
		QueueSize:        1024,
		Thresholds:       health.DefaultThresholds(),
		Limits:           peerlimit.DefaultConfig(),

		MaxConcurrentStreams: DefaultMaxConcurrentStreams,
		MaxRequestBytes:      DefaultMaxRequestBytes,
		MaxResponseBytes:     DefaultMaxResponseBytes,

		OperatorDeregister: "loopback",
	}
}

// Validate reports the first setting that cannot work: a
// *configerr.Error naming the Config field and wrapping ErrInvalidConfig,
// or a security check's error naming flags.
func (c *Config) Validate() error {
	filled := c.withDefaults()
	c = &filled
	if _, _, err := net.SplitHostPort(c.Listen); err != nil {
		return invalid("Listen", c.Listen, "must be host:port")
	}
	if c.MetricsListen != "off" && c.MetricsListen != "" {
		if _, _, err := net.SplitHostPort(c.MetricsListen); err != nil {
			return invalid("MetricsListen", c.MetricsListen, `must be host:port or "off"`)
		}
	}
	for _, ep := range c.EtcdEndpoints {
		if strings.TrimSpace(ep) == "" {
			return invalid("EtcdEndpoints", strings.Join(c.EtcdEndpoints, ","), "has an empty entry")
		}
	}
	if c.SessionTTL < 2*time.Second || c.SessionTTL > time.Minute || c.SessionTTL%time.Second != 0 {
		// Whole seconds: etcd grants the election's lease in seconds.
		return invalid("SessionTTL", c.SessionTTL, "must be whole seconds within 2s..1m (0: the default)")
	}
	if c.Prefix != "" && !strings.HasPrefix(c.Prefix, "/") {
		return invalid("Prefix", c.Prefix, "must start with '/'")
	}
	if c.ProbeInterval != 0 && c.ProbeInterval < 100*time.Millisecond {
		return invalid("ProbeInterval", c.ProbeInterval, "must be at least the 100ms floor (0: the default)")
	}
	for _, f := range []struct {
		name string
		v    any
		neg  bool
	}{
		{"ProbeTimeout", c.ProbeTimeout, c.ProbeTimeout < 0}, {"ProbeConcurrency", c.ProbeConcurrency, c.ProbeConcurrency < 0},
		{"RingSize", c.RingSize, c.RingSize < 0}, {"QueueSize", c.QueueSize, c.QueueSize < 0},
		{"ShutdownGrace", c.ShutdownGrace, c.ShutdownGrace < 0},
	} {
		if f.neg {
			return invalid(f.name, f.v, "must be >= 0 (0: the default)")
		}
	}
	if c.Thresholds != (health.Thresholds{}) {
		if err := c.Thresholds.Validate(); err != nil {
			return configerr.Within(ErrInvalidConfig, "node", "Thresholds", err)
		}
	}
	if c.Limits != (peerlimit.Config{}) {
		if err := c.Limits.Validate(); err != nil {
			return configerr.Within(ErrInvalidConfig, "node", "Limits", err)
		}
	}
	if err := c.validateAPILimits(); err != nil {
		return err
	}
	if s := c.OperatorDeregister; s != "" && s != "loopback" && s != "none" {
		return invalid("OperatorDeregister", s, `must be "loopback" or "none"`)
	}
	if s := c.Embed.ClusterState; s != "" && s != "new" && s != "existing" {
		return invalid("Embed.ClusterState", s, `must be "new" or "existing"`)
	}
	return c.validateSecurity()
}

// Node is a running regnode.
type Node struct {
	cfg     Config
	log     *slog.Logger
	etcd    *embedded.Member  // nil when external
	dataDir *embedded.DataDir // the embedded member's, held from Start to Close
	cli     *clientv3.Client
	grpc    *grpc.Server
	health  *grpchealth.Server
	lis     net.Listener
	metrics *metrics.Metrics
	hub     *fanout.Hub
	stopHub context.CancelFunc
	renew   *leasepool.Renewer // every renewal, on one LeaseKeepAlive stream
	leases  *leasepool.Pool    // Register's leases, granted ahead
	commit  *txnbatch.Batcher  // Register's writes, group-committed
	probe   *probe.Checker
	stopEl  context.CancelFunc
	elDone  chan struct{}
	mhttp   *http.Server
	self    *selfListener // the HTTP API's way in when the API serves TLS, or nil
	mlis    net.Listener

	stopAuth context.CancelFunc // stops the token cache's watch, or nil

	wg        sync.WaitGroup
	closeOnce sync.Once
	closeErr  error
	done      chan struct{}
	serveErr  chan error
}

// Start brings a regnode up and returns once its API accepts calls.
func Start(ctx context.Context, cfg Config) (_ *Node, err error) {
	if err := cfg.Validate(); err != nil {
		return nil, err
	}
	cfg = cfg.withDefaults()
	n := &Node{cfg: cfg, log: cfg.Logger, done: make(chan struct{}), serveErr: make(chan error, 4)}
	defer func() {
		if err != nil {
			n.shutdown()
			n.dataDir.Discard() // a failed start leaves no half-made data dir
		}
	}()

	// What can be refused at once (the data dir, the ports) is checked
	// before etcd writes a byte: a second regnode on the same data dir, or
	// a port in use, fails here and leaves the disk as it was. The ports
	// are only tried, not kept: a client that reached a listener with no
	// server behind it would wait there instead of trying another regnode.
	endpoints := cfg.EtcdEndpoints
	if len(endpoints) == 0 {
		if n.dataDir, err = embedded.LockDataDir(cfg.Embed.Dir); err != nil {
			return nil, err
		}
		cfg.Embed.DataDir = n.dataDir
	}
	// Certificates that do not load are refused before etcd starts.
	var serverTLS *tls.Config
	if cfg.TLS.Enabled() {
		if serverTLS, err = tlsfiles.ServerConfig(cfg.TLS, n.log); err != nil {
			return nil, fmt.Errorf("API TLS: %w", err)
		}
	}
	if err := portFree("API", cfg.Listen); err != nil {
		return nil, err
	}
	if cfg.MetricsListen != "off" {
		if err := portFree("metrics", cfg.MetricsListen); err != nil {
			return nil, err
		}
	}

	if len(endpoints) == 0 {
		if cfg.Embed.Logger == nil {
			cfg.Embed.Logger = cfg.Logger
		}
		if n.etcd, err = embedded.Start(ctx, cfg.Embed); err != nil {
			return nil, err
		}
		endpoints = memberEndpoints(n.etcd, cfg.Embed.ClientTLS.Enabled())
		if cfg.Name == "" {
			cfg.Name = n.etcd.Config().Name
		}
		n.wg.Add(1)
		go func() { // forwards a failure of the member until Close
			defer n.wg.Done()
			select {
			case err := <-n.etcd.Err():
				if err != nil {
					n.serveErr <- fmt.Errorf("embedded etcd: %w", err)
				}
			case <-n.done:
			}
		}()
	}
	if cfg.Name == "" {
		// Several regnodes may share a host: the API address tells them apart.
		host, _ := os.Hostname()
		cfg.Name = host + "/" + cfg.Listen
	}
	n.cfg = cfg
	etcdTLS, err := n.etcdClientTLS(ctx, endpoints)
	if err != nil {
		return nil, err
	}
	if n.etcd != nil && cfg.EmbedAuth {
		if cfg.EtcdUsername, cfg.EtcdPassword, err = n.embeddedAuth(ctx, endpoints, etcdTLS); err != nil {
			return nil, err
		}
	}
	dialTimeout := 5 * time.Second
	if cfg.EtcdUsername != "" {
		// New also authenticates: a bcrypt on etcd's side, which takes
		// seconds on a loaded machine; a wrong password should say so,
		// not time out.
		dialTimeout = 15 * time.Second
	}
	if n.cli, err = clientv3.New(clientv3.Config{Endpoints: endpoints, DialTimeout: dialTimeout,
		TLS: etcdTLS, Username: cfg.EtcdUsername, Password: cfg.EtcdPassword,
		Logger: zapslog.New(n.log, "warn", nil), Context: context.Background()}); err != nil {
		return nil, fmt.Errorf("etcd client of %v: %w", endpoints, err)
	}
	// Fail now, not on the first call, if etcd is not reachable.
	n.log.Info("waiting for etcd to answer", "endpoints", endpoints)
	pctx, cancel := context.WithTimeout(ctx, 10*time.Second)
	_, err = n.cli.Get(pctx, "health-probe")
	cancel()
	if err != nil {
		return nil, fmt.Errorf("etcd at %v does not answer: %w", endpoints, err)
	}

	n.metrics = metrics.New()
	// Registration past raw etcd: leases taken from a pool granted ahead,
	// renewals on one stream, and with GroupCommit concurrent
	// registrations' writes committed as one Txn.
	n.renew = leasepool.NewRenewer(n.cli, n.log)
	pc := leasepool.DefaultConfig()
	pc.Client, pc.Renewer, pc.Logger = n.cli, n.renew, n.log
	if n.leases, err = leasepool.New(pc); err != nil {
		return nil, err
	}
	sc := store.Config{Client: n.cli, Prefix: cfg.Prefix, Logger: n.log,
		OnJunk: func(string, error) { n.metrics.JunkSkipped.Inc() },
		Leases: n.leases, Renew: n.renew}
	if cfg.GroupCommit {
		bc := txnbatch.DefaultConfig()
		bc.Client, bc.Logger = n.cli, n.log
		if n.commit, err = txnbatch.New(bc); err != nil {
			return nil, err
		}
		sc.Commit = n.commit
	}
	st, err := store.New(sc)
	if err != nil {
		return nil, err
	}
	m := n.metrics
	n.hub, err = fanout.New(fanout.Config{Client: n.cli, Prefix: cfg.Prefix, Logger: n.log,
		RingSize: cfg.RingSize, QueueSize: cfg.QueueSize,
		OnJunk:         func(string, error) { m.JunkSkipped.Inc() },
		OnWatchRestart: func(reason string, _ error) { m.WatchRestarts.WithLabelValues(reason).Inc() },
		OnReset:        func(reason string) { m.ResetsSent.WithLabelValues(reason).Inc() },
		OnStale:        func() { m.StaleBatches.Inc() },
		OnSubscribers:  func(k int) { m.Subscribers.Set(float64(k)) },
	})
	if err != nil {
		return nil, err
	}
	hubCtx, stopHub := context.WithCancel(context.Background())
	n.stopHub = stopHub
	n.wg.Add(1)
	go func() {
		defer n.wg.Done()
		if err := n.hub.Run(hubCtx); err != nil && hubCtx.Err() == nil {
			n.serveErr <- fmt.Errorf("fan-out: %w", err)
		}
	}()
	m.WatchInstances(n.hub.Cache().Snapshot)
	if err := n.startProber(cfg, st); err != nil {
		return nil, err
	}
	if cfg.Limits == (peerlimit.Config{}) {
		cfg.Limits = peerlimit.DefaultConfig()
	}
	limits, err := peerlimit.New(cfg.Limits)
	if err != nil {
		return nil, err
	}
	operator := server.LoopbackOperator
	if cfg.OperatorDeregister == "none" {
		operator = server.NoOperator
	}
	var (
		unary    = []grpc.UnaryServerInterceptor{n.metrics.UnaryInterceptor()}
		stream   = []grpc.StreamServerInterceptor{n.metrics.StreamInterceptor()}
		limitKey func(context.Context) string
		tokens   *server.Tokens
	)
	if cfg.Auth { // auth.go
		var check *server.Auth
		if check, tokens, err = n.startAuth(ctx); err != nil {
			return nil, err
		}
		unary, stream = append(unary, check.Unary()), append(stream, check.Stream())
		operator, limitKey = server.TokenOperator, server.TokenLimitKey
	} else {
		n.warnAuthOff(ctx)
	}
	if n.lis, err = net.Listen("tcp", cfg.Listen); err != nil {
		return nil, fmt.Errorf("listen for the API on %s: %w", cfg.Listen, err)
	}
	api, err := server.New(server.Config{Store: st, Metrics: n.metrics, Node: cfg.Name, Embedded: n.etcd != nil,
		Version: Version, Logger: n.log, Hub: n.hub, Leader: n.leader, Limits: limits, Operator: operator, LimitKey: limitKey,
		Addr: n.Addr(), Peers: n.peers, DialPeer: n.dialPeer})
	if err != nil {
		return nil, err
	}
	// Announced before Start returns: a WaitApplied anywhere counts this
	// regnode's subscribers from its first one on (peers.go).
	sess, err := n.announce(ctx)
	if err != nil {
		return nil, err
	}
	actx, acancel := context.WithCancel(context.Background())
	n.wg.Add(2)
	go n.keepAnnounced(actx, sess)
	go func() { defer n.wg.Done(); <-n.done; acancel() }()
	var transport []grpc.ServerOption
	if serverTLS != nil {
		n.self = newSelfListener() // the HTTP API's calls: self.go
		transport = append(transport, grpc.Creds(selfCreds{credentials.NewTLS(serverTLS)}))
	}
	n.grpc = grpc.NewServer(append(append(transport,
		grpc.KeepaliveEnforcementPolicy(keepaliveEnforcement),
		grpc.KeepaliveParams(keepaliveServer),
		grpc.MaxConcurrentStreams(cfg.MaxConcurrentStreams),
		grpc.MaxRecvMsgSize(cfg.MaxRequestBytes),
		grpc.MaxSendMsgSize(cfg.MaxResponseBytes),
		grpc.ChainUnaryInterceptor(append(unary, n.noSpaceLog())...),
		grpc.ChainStreamInterceptor(stream...),
	), server.DecodeOptions()...)...)
	registryv1.RegisterRegistryServer(n.grpc, api)
	if tokens != nil {
		registryv1.RegisterTokensServer(n.grpc, tokens)
	}
	n.sweepHolds(api)
	n.health = grpchealth.NewServer()
	healthpb.RegisterHealthServer(n.grpc, n.health)
	reflection.Register(n.grpc)
	n.health.SetServingStatus("", healthpb.HealthCheckResponse_SERVING)
	n.health.SetServingStatus(registryv1.Registry_ServiceDesc.ServiceName, healthpb.HealthCheckResponse_SERVING)
	n.wg.Add(1)
	go func() {
		defer n.wg.Done()
		if err := n.grpc.Serve(n.lis); err != nil {
			n.serveErr <- fmt.Errorf("API server: %w", err)
		}
	}()
	if n.self != nil {
		n.wg.Add(1)
		go func() {
			defer n.wg.Done()
			if err := n.grpc.Serve(n.self); err != nil {
				n.serveErr <- fmt.Errorf("API server, in-memory listener: %w", err)
			}
		}()
	}

	if cfg.MetricsListen != "off" {
		if n.mlis, err = net.Listen("tcp", cfg.MetricsListen); err != nil {
			return nil, fmt.Errorf("listen for metrics on %s: %w", cfg.MetricsListen, err)
		}
		mux := http.NewServeMux()
		mux.Handle("/metrics", promhttp.HandlerFor(n.metrics.Registry, promhttp.HandlerOpts{}))
		if err := n.mountWeb(mux); err != nil { // the JSON API and the dashboard: web.go
			return nil, err
		}
		n.mhttp = &http.Server{Handler: mux, ReadHeaderTimeout: 5 * time.Second, TLSConfig: serverTLS,
			// Failed handshakes are the clients' doing (a scanner, a
			// plaintext scrape): debug, not stderr.
			ErrorLog: slog.NewLogLogger(n.log.Handler(), slog.LevelDebug)}
		n.wg.Add(1)
		go func() {
			defer n.wg.Done()
			serve := n.mhttp.Serve
			if serverTLS != nil {
				// The certificate comes from TLSConfig (reloaded), not files.
				serve = func(l net.Listener) error { return n.mhttp.ServeTLS(l, "", "") }
			}
			if err := serve(n.mlis); err != nil && !errors.Is(err, http.ErrServerClosed) {
				n.serveErr <- fmt.Errorf("metrics server: %w", err)
			}
		}()
	}
	mode := "embedded etcd member " + cfg.Embed.Name + " (data in " + cfg.Embed.Dir + ")"
	if n.etcd == nil {
		mode = "external etcd " + strings.Join(endpoints, ",")
	}
	n.log.Info("regnode serving", "node", cfg.Name, "api", n.Addr(), "metrics", n.MetricsAddr(),
		"tls", cfg.TLS.Enabled(), "client_cert_auth", cfg.TLS.TrustedCAFile != "", "auth", cfg.Auth,
		"etcd", mode, "prefix", cfg.Prefix)
	return n, nil
}

// Addr is the API's listening address.
func (n *Node) Addr() string { return n.lis.Addr().String() }

// MetricsAddr is where /metrics is served, or "" if disabled.
func (n *Node) MetricsAddr() string {
	if n.mlis == nil {
		return ""
	}
	return n.mlis.Addr().String()
}

// Name is this regnode's name.
func (n *Node) Name() string { return n.cfg.Name }

// Etcd is the regnode's etcd client (owned by the Node).
func (n *Node) Etcd() *clientv3.Client { return n.cli }

// Metrics are the node's counters.
func (n *Node) Metrics() *metrics.Metrics { return n.metrics }

// IdleLeases is how many leases the registration lease pool holds ready
// (granted ahead, attached to no key, revoked by Close).
func (n *Node) IdleLeases() int {
	if n.leases == nil {
		return 0
	}
	return n.leases.IdleTotal()
}

// Hub is the node's subscription fan-out.
func (n *Node) Hub() *fanout.Hub { return n.hub }

// Embedded is the embedded etcd member, or nil when etcd is external.
func (n *Node) Embedded() *embedded.Member { return n.etcd }

// Err reports a server that stopped on its own (a listener failed) or an
// embedded etcd that failed; regnode exits on it.
func (n *Node) Err() <-chan error { return n.serveErr }

// Close stops the regnode: health turns NOT_SERVING, calls in flight get
// ShutdownGrace to finish, streams are closed (clients move to another
// regnode), then the etcd client and the embedded member close. It is
// idempotent.
func (n *Node) Close() error {
	n.closeOnce.Do(func() { n.closeErr = n.shutdown() })
	return n.closeErr
}

func (n *Node) shutdown() error {
	close(n.done)
	if n.health != nil {
		n.health.Shutdown()
	}
	if n.stopEl != nil {
		n.stopEl() // resigns: another regnode takes over probing at once
		t := time.NewTimer(n.cfg.ShutdownGrace)
		select {
		case <-n.elDone:
		case <-t.C:
			// Opening an election session waits on etcd for as long as
			// the client lives: with etcd unreachable only closing the
			// client ends it (a second Close below is harmless).
			n.log.Warn("election still waiting on etcd; closing the etcd client to stop it")
			n.cli.Close()
			<-n.elDone
		}
		t.Stop()
	}
	if n.probe != nil {
		n.probe.Close()
	}
	if n.stopHub != nil {
		n.stopHub() // ends every Watch stream: subscribers resume elsewhere
	}
	if n.grpc != nil {
		stopped := make(chan struct{})
		go func() { n.grpc.GracefulStop(); close(stopped) }()
		t := time.NewTimer(n.cfg.ShutdownGrace)
		select {
		case <-stopped:
		case <-t.C:
			n.grpc.Stop() // long streams (KeepAlive, Watch) end here
			<-stopped
		}
		t.Stop()
	}
	var errs []error
	if n.mhttp != nil {
		ctx, cancel := context.WithTimeout(context.Background(), n.cfg.ShutdownGrace)
		if err := n.mhttp.Shutdown(ctx); err != nil {
			errs = append(errs, fmt.Errorf("stop metrics server: %w", err))
		}
		cancel()
	} else if n.mlis != nil {
		n.mlis.Close()
	}
	if n.grpc == nil && n.lis != nil {
		n.lis.Close()
	}
	if n.stopAuth != nil {
		n.stopAuth()
	}
	n.wg.Wait()
	// No call is in flight now: the pool's idle leases are nobody's, so
	// they are revoked while etcd is still there (a crash leaves them to
	// expire within their TTL).
	if n.commit != nil {
		n.commit.Close()
	}
	if n.leases != nil {
		ctx, cancel := context.WithTimeout(context.Background(), n.cfg.ShutdownGrace)
		if err := n.leases.Close(ctx); err != nil {
			n.log.Warn("revoke the lease pool's idle leases (they expire within their TTL)", "err", err)
		}
		cancel()
	}
	if n.renew != nil {
		n.renew.Close()
	}
	if n.cli != nil {
		if err := n.cli.Close(); err != nil && !errors.Is(err, context.Canceled) {
			errs = append(errs, fmt.Errorf("close etcd client: %w", err))
		}
	}
	if n.etcd != nil {
		n.etcd.Close() // flushes and closes the member's WAL and backend
	}
	if err := n.dataDir.Unlock(); err != nil {
		errs = append(errs, err)
	}
	if n.grpc != nil { // it served: say it stopped
		n.log.Info("regnode stopped", "node", n.cfg.Name)
	}
	return errors.Join(errs...)
}

// startProber runs the prober election: while this regnode leads, it
// health-checks every instance with a check.
func (n *Node) startProber(cfg Config, st *store.Store) error {
	m := n.metrics
	var err error
	if n.probe, err = probe.New(probe.Config{DefaultTimeout: cfg.ProbeTimeout, Logger: n.log}); err != nil {
		return err
	}
	pr, err := prober.New(prober.Config{Store: st, View: n.hub.Cache().Snapshot, Probe: n.probe,
		Thresholds: cfg.Thresholds, Interval: cfg.ProbeInterval, Concurrency: cfg.ProbeConcurrency,
		Node: cfg.Name, Logger: n.log,
		OnProbe: func(o health.Outcome, d time.Duration) {
			m.Probes.WithLabelValues(strings.ToLower(o.String())).Inc()
			m.ProbeSeconds.Observe(d.Seconds())
		},
		OnTransition: func(tr health.Transition) {
			m.Transitions.WithLabelValues(view(tr.From), view(tr.To)).Inc()
		},
		OnFenced: m.FenceRejections.Inc,
	})
	if err != nil {
		return err
	}
	el, err := election.New(election.Config{Client: n.cli, Prefix: cfg.Prefix, Name: cfg.Name,
		SessionTTL: cfg.SessionTTL, Logger: n.log,
		OnLeaderChange: func(leading bool) {
			m.LeaderChanges.Inc()
			if leading {
				m.Leading.Set(1)
			} else {
				m.Leading.Set(0)
			}
		}})
	if err != nil {
		return err
	}
	ctx, cancel := context.WithCancel(context.Background())
	n.stopEl, n.elDone = cancel, make(chan struct{})
	go func() {
		defer close(n.elDone)
		select { // probe from a filled view
		case <-n.hub.Ready():
		case <-ctx.Done():
			return
		}
		_ = el.Run(ctx, pr.Lead)
	}()
	return nil
}

func view(s registryv1.HealthState) string {
	return strings.TrimPrefix(s.String(), "HEALTH_STATE_")
}

// leader names the prober leader for Status ("" if none or unknown).
func (n *Node) leader(ctx context.Context) string {
	l, err := election.CurrentLeader(ctx, n.cli, n.cfg.Prefix)
	if err != nil {
		return ""
	}
	return l.Name
}

// portFree fails if addr cannot be listened on now (port 0 always can).
func portFree(what, addr string) error {
	l, err := net.Listen("tcp", addr)
	if err != nil {
		return fmt.Errorf("listen for the %s on %s: %w", what, addr, err)
	}
	return l.Close()
}
