package node

import (
	"context"
	"crypto/tls"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"net/http"
	"net/http/pprof"
	"os"
	"strings"
	"time"

	"github.com/prometheus/client_golang/prometheus/promhttp"
	clientv3 "go.etcd.io/etcd/client/v3"
	"go.etcd.io/etcd/client/v3/concurrency"
	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials"
	grpchealth "google.golang.org/grpc/health"
	healthpb "google.golang.org/grpc/health/grpc_health_v1"
	"google.golang.org/grpc/reflection"

	"github.com/regcluster/registry/internal/embedded"
	"github.com/regcluster/registry/internal/fanout"
	"github.com/regcluster/registry/internal/leasepool"
	"github.com/regcluster/registry/internal/metrics"
	"github.com/regcluster/registry/internal/peerlimit"
	"github.com/regcluster/registry/internal/server"
	"github.com/regcluster/registry/internal/stopper"
	"github.com/regcluster/registry/internal/tlsfiles"
	"github.com/regcluster/registry/internal/txnbatch"
	"github.com/regcluster/registry/internal/zapslog"
	registryv1 "github.com/regcluster/registry/proto/registry/v1"
	"github.com/regcluster/registry/store"
	"github.com/regcluster/registry/xds"
)

// Start brings a regnode up and returns once its API accepts calls.
func Start(ctx context.Context, cfg Config) (_ *Node, err error) {
	if err := cfg.Validate(); err != nil {
		return nil, err
	}
	cfg = cfg.withDefaults()
	n := &Node{cfg: cfg, log: cfg.Logger, life: stopper.New()}
	defer func() {
		if err != nil {
			// What started stops, latest first; the data dir is
			// discarded, not kept: a failed start leaves no half-made one.
			n.life.Stop()
		}
	}()

	// What can be refused at once (the data dir, the ports) is checked
	// before etcd writes a byte: a second regnode on the same data dir, or
	// a port in use, fails here and leaves the disk as it was. The ports
	// are only tried, not kept: a client that reached a listener with no
	// server behind it would wait there instead of trying another regnode.
	endpoints := cfg.EtcdEndpoints
	if len(endpoints) == 0 {
		if err = n.life.Start(ctx, stopper.Component{Name: "data dir",
			Start: func(context.Context) (err error) {
				n.dataDir, err = embedded.LockDataDir(cfg.Embed.Dir)
				return err
			},
			Close: func() error {
				if !n.up {
					return n.dataDir.Discard()
				}
				return n.dataDir.Unlock()
			}}); err != nil {
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
	if cfg.DNS.Listen != "" {
		if err := dnsPortFree(cfg.DNS.Listen); err != nil {
			return nil, err
		}
	}

	if len(endpoints) == 0 {
		if cfg.Embed.Logger == nil {
			cfg.Embed.Logger = cfg.Logger
		}
		if err = n.life.Start(ctx, stopper.Component{Name: "embedded etcd",
			Start: func(ctx context.Context) (err error) {
				n.etcd, err = embedded.Start(ctx, cfg.Embed)
				return err
			},
			Run: func(ctx context.Context) error { // a failure of the member, until Close
				select {
				case err := <-n.etcd.Err():
					return err
				case <-ctx.Done():
					return nil
				}
			},
			Close: func() error { n.etcd.Close(); return nil }, // flushes and closes the member's WAL and backend
		}); err != nil {
			return nil, err
		}
		endpoints = memberEndpoints(n.etcd, cfg.Embed.ClientTLS.Enabled())
		if cfg.Name == "" {
			cfg.Name = n.etcd.Config().Name
		}
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
	if err = n.life.Start(ctx, stopper.Component{Name: "etcd client",
		Start: func(context.Context) (err error) {
			if n.cli, err = clientv3.New(clientv3.Config{Endpoints: endpoints, DialTimeout: dialTimeout,
				TLS: etcdTLS, Username: cfg.EtcdUsername, Password: cfg.EtcdPassword,
				Logger: zapslog.New(n.log, "warn", nil), Context: context.Background()}); err != nil {
				return fmt.Errorf("etcd client of %v: %w", endpoints, err)
			}
			return nil
		},
		Close: func() error {
			if err := n.cli.Close(); err != nil && !errors.Is(err, context.Canceled) {
				return err
			}
			return nil
		}}); err != nil {
		return nil, err
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
	// renewals on one stream, and (unless NoGroupCommit) concurrent
	// registrations' writes committed as one Txn.
	n.renew = leasepool.NewRenewer(n.cli, n.log)
	if err = n.life.Start(ctx, stopper.Component{Name: "lease renewer",
		Close: func() error { n.renew.Close(); return nil }}); err != nil {
		return nil, err
	}
	pc := leasepool.DefaultConfig()
	pc.Client, pc.Renewer, pc.Logger = n.cli, n.renew, n.log
	if err = n.life.Start(ctx, stopper.Component{Name: "lease pool",
		Start: func(context.Context) (err error) { n.leases, err = leasepool.New(pc); return err },
		Close: func() error {
			// No call is in flight now: the pool's idle leases are
			// nobody's, so they are revoked while etcd is still there (a
			// crash leaves them to expire within their TTL).
			ctx, cancel := context.WithTimeout(context.Background(), n.cfg.ShutdownGrace)
			defer cancel()
			if err := n.leases.Close(ctx); err != nil {
				n.log.Warn("revoke the lease pool's idle leases (they expire within their TTL)", "err", err)
			}
			return nil
		}}); err != nil {
		return nil, err
	}
	sc := store.Config{Client: n.cli, Prefix: cfg.Prefix, Logger: n.log,
		OnJunk: func(string, error) { n.metrics.JunkSkipped.Inc() },
		Leases: n.leases, Renew: n.renew}
	if !cfg.NoGroupCommit {
		bc := txnbatch.DefaultConfig()
		bc.Client, bc.Logger = n.cli, n.log
		if err = n.life.Start(ctx, stopper.Component{Name: "txn batcher",
			Start: func(context.Context) (err error) { n.commit, err = txnbatch.New(bc); return err },
			Close: func() error { n.commit.Close(); return nil }}); err != nil {
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
	// Quiesced: stopping it ends every Watch stream at once, so that the
	// API's graceful stop waits only for unary calls, and subscribers
	// resume on another regnode.
	if err = n.life.Start(ctx, stopper.Component{Name: "fan-out", Run: n.hub.Run, Quiesce: true}); err != nil {
		return nil, err
	}
	m.WatchInstances(n.hub.Cache().Snapshot)
	if err := n.startProber(ctx, cfg, st); err != nil {
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
	// First: the HTTP API's calls are judged as its HTTP callers' (web.go).
	n.forward = server.NewForwarder()
	var (
		unary    = []grpc.UnaryServerInterceptor{n.forward.Unary(), n.metrics.UnaryInterceptor()}
		stream   = []grpc.StreamServerInterceptor{n.forward.Stream(), n.metrics.StreamInterceptor()}
		limitKey func(context.Context) string
		tokens   *server.Tokens
	)
	var check *server.Auth // with --auth
	if cfg.Auth {          // auth.go
		if check, tokens, err = n.startAuth(ctx); err != nil {
			return nil, err
		}
		unary, stream = append(unary, check.Unary()), append(stream, check.Stream())
		operator, limitKey = server.TokenOperator, server.TokenLimitKey
	} else {
		n.warnAuthOff(ctx)
	}
	if err = n.life.Start(ctx, stopper.Component{Name: "API listener",
		Start: func(context.Context) (err error) {
			if n.lis, err = net.Listen("tcp", cfg.Listen); err != nil {
				return fmt.Errorf("listen for the API on %s: %w", cfg.Listen, err)
			}
			return nil
		},
		// Serve closes it; this is for a start that fails before.
		Close: func() error { n.lis.Close(); return nil }}); err != nil {
		return nil, err
	}
	advertise, err := n.advertiseAddr()
	if err != nil {
		return nil, err
	}
	// xDS for every language, fed by the fan-out (started with the API
	// below); a drain waits for its clients' ACKs.
	xcfg := xds.Config{Hub: n.hub, Logger: n.log, Registerer: n.metrics.Registry}
	if check != nil { // an xDS client is served what its token may read
		xcfg.Scope = func(ctx context.Context) (bool, func(string) bool) {
			return check.CanRead(ctx, ""), func(service string) bool { return check.CanRead(ctx, service) }
		}
	}
	xs, err := xds.New(xcfg)
	if err != nil {
		return nil, err
	}
	n.xds = xs
	if n.peerSecret, err = n.ensurePeerSecret(ctx); err != nil {
		return nil, err
	}
	if check != nil {
		check.AllowPeers(n.peerSecret)
	}
	api, err := server.New(server.Config{
		Confirm: func(ctx context.Context, req *registryv1.ConfirmProbeRequest) (*registryv1.ConfirmProbeResponse, error) {
			return n.shards.serveConfirm(ctx, req)
		},
		Probing: func() *registryv1.Probing { return n.shards.probing() },
		Report: func(_ context.Context, reporter string, r *registryv1.SubscribeReport) {
			n.reports.take(reporter, r)
		},
		Forwarded: func(ctx context.Context, req *registryv1.ForwardReportsRequest) error {
			return n.reports.forwarded(ctx, req)
		},
		XDS: xs, XDSList: xdsList{xs}, Store: st, Metrics: n.metrics, Node: cfg.Name, Embedded: n.etcd != nil,
		Version: Version, Logger: n.log, Hub: n.hub, Leader: n.leader, Limits: limits, Operator: operator, LimitKey: limitKey,
		Addr: advertise, Peers: n.peers, DialPeer: n.dialPeer})
	if err != nil {
		return nil, err
	}
	// Announced before Start returns: a WaitApplied anywhere counts this
	// regnode's subscribers from its first one on (peers.go).
	// Quiesced: it goes first when the regnode stops, so that peers stop
	// counting it while it drains.
	n.shards = newSharding(n, advertise)
	var sess *concurrency.Session
	if err = n.life.Start(ctx, stopper.Component{Name: "announcement",
		Start:   func(ctx context.Context) (err error) { sess, err = n.announce(ctx, advertise); return err },
		Run:     func(ctx context.Context) error { n.keepAnnounced(ctx, sess, advertise); return nil },
		Quiesce: true}); err != nil {
		return nil, err
	}
	if err = n.startSharding(ctx); err != nil {
		return nil, err
	}
	var transport []grpc.ServerOption
	if serverTLS != nil {
		n.self = newSelfListener() // the HTTP API's calls: self.go
		transport = append(transport, grpc.Creds(selfCreds{credentials.NewTLS(serverTLS)}))
	}
	stream = append(stream, api.LimitXDS())
	n.grpc = grpc.NewServer(append(append(transport,
		grpc.KeepaliveEnforcementPolicy(keepaliveEnforcement),
		grpc.KeepaliveParams(keepaliveServer),
		grpc.MaxConcurrentStreams(cfg.MaxConcurrentStreams),
		grpc.InitialWindowSize(receiveWindow), grpc.InitialConnWindowSize(receiveWindow),
		grpc.MaxRecvMsgSize(cfg.MaxRequestBytes),
		grpc.MaxSendMsgSize(cfg.MaxResponseBytes),
		grpc.ChainUnaryInterceptor(append(unary, n.noSpaceLog())...),
		grpc.ChainStreamInterceptor(stream...),
	), server.DecodeOptions()...)...)
	registryv1.RegisterRegistryServer(n.grpc, api)
	if tokens != nil {
		registryv1.RegisterTokensServer(n.grpc, tokens)
	}
	if err = n.sweepHolds(ctx, api); err != nil {
		return nil, err
	}
	n.health = grpchealth.NewServer()
	healthpb.RegisterHealthServer(n.grpc, n.health)
	reflection.Register(n.grpc)
	xs.Register(n.grpc)
	if err = n.life.Start(ctx, stopper.Component{Name: "xDS", Run: xs.Run, Quiesce: true}); err != nil {
		return nil, err
	}
	n.health.SetServingStatus("", healthpb.HealthCheckResponse_SERVING)
	n.health.SetServingStatus(registryv1.Registry_ServiceDesc.ServiceName, healthpb.HealthCheckResponse_SERVING)
	if err = n.life.Start(ctx, stopper.Component{Name: "API server", Run: n.serveAPI}); err != nil {
		return nil, err
	}
	if err = n.startDNS(ctx); err != nil { // dns.go
		return nil, err
	}

	if cfg.MetricsListen != "off" {
		if n.mlis, err = net.Listen("tcp", cfg.MetricsListen); err != nil {
			return nil, fmt.Errorf("listen for metrics on %s: %w", cfg.MetricsListen, err)
		}
		if err = n.life.Start(ctx, stopper.Component{Name: "metrics listener",
			// Serve closes it; this is for a start that fails before.
			Close: func() error { n.mlis.Close(); return nil }}); err != nil {
			return nil, err
		}
		mux := http.NewServeMux()
		mux.Handle("/metrics", promhttp.HandlerFor(n.metrics.Registry, promhttp.HandlerOpts{}))
		if cfg.EnablePprof {
			mux.HandleFunc("/debug/pprof/", pprof.Index)
			mux.HandleFunc("/debug/pprof/cmdline", pprof.Cmdline)
			mux.HandleFunc("/debug/pprof/profile", pprof.Profile)
			mux.HandleFunc("/debug/pprof/symbol", pprof.Symbol)
			mux.HandleFunc("/debug/pprof/trace", pprof.Trace)
		}
		if err := n.mountWeb(ctx, mux); err != nil { // the JSON API and the dashboard: web.go
			return nil, err
		}
		n.mhttp = &http.Server{Handler: mux, ReadHeaderTimeout: 5 * time.Second, TLSConfig: serverTLS,
			// Failed handshakes are the clients' doing (a scanner, a
			// plaintext scrape): debug, not stderr.
			ErrorLog: slog.NewLogLogger(n.log.Handler(), slog.LevelDebug)}
		if err = n.life.Start(ctx, stopper.Component{Name: "metrics server", Run: n.serveHTTP}); err != nil {
			return nil, err
		}
	}
	// Last started, so first stopped in turn (right after the quiesce
	// step's signals): health checks see NOT_SERVING while the rest drains.
	if err = n.life.Start(ctx, stopper.Component{Name: "health",
		Close: func() error { n.health.Shutdown(); return nil }}); err != nil {
		return nil, err
	}
	mode := "embedded etcd member " + cfg.Embed.Name + " (data in " + cfg.Embed.Dir + ")"
	if n.etcd == nil {
		mode = "external etcd " + strings.Join(endpoints, ",")
	}
	n.log.Info("regnode serving", "node", cfg.Name, "api", n.Addr(), "advertise", advertise, "metrics", n.MetricsAddr(), "dns", n.DNSAddr(),
		"tls", cfg.TLS.Enabled(), "client_cert_auth", cfg.TLS.TrustedCAFile != "", "auth", cfg.Auth,
		"etcd", mode, "prefix", cfg.Prefix)
	n.up = true
	return n, nil
}

// portFree fails if addr cannot be listened on now (port 0 always can).
func portFree(what, addr string) error {
	l, err := net.Listen("tcp", addr)
	if err != nil {
		return fmt.Errorf("listen for the %s on %s: %w", what, addr, err)
	}
	return l.Close()
}
