// Command regnode is the registry daemon. With no flags it embeds a
// single-member etcd (data in ./regnode.data) and serves the registry.v1 API
// on 127.0.0.1:7400; --etcd-endpoints makes it a client of an external etcd
// cluster instead. Every flag can also be set as REGNODE_<FLAG> (upper case,
// '-' as '_'). SIGINT or SIGTERM stops it cleanly with exit status 0, at any
// stage of start-up too; a second signal while it stops ends it at once.
// A data dir another regnode holds is refused at once (exit 1, naming it).
// --cert-file and --key-file serve the API and the metrics port over TLS
// (etcd's flags and meanings); a listener on a non-loopback address without
// TLS is refused (exit 2) unless --insecure says so. --auth requires a
// scoped token on every call (and, on an embedded member, turns etcd's own
// auth on unless --etcd-server-auth=false); the first start writes an admin
// token to a file (its path, never the token, is logged). --dns-listen
// serves the registry over DNS as well (package dnsapi).
package main

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"os"
	"os/signal"
	"strings"
	"syscall"
	"time"

	"github.com/spf13/cobra"
	"github.com/spf13/pflag"

	"github.com/regcluster/registry/internal/buildinfo"
	"github.com/regcluster/registry/internal/configerr"
	"github.com/regcluster/registry/internal/embedded"
	"github.com/regcluster/registry/internal/node"
)

func main() {
	os.Exit(run(os.Args[1:]))
}

// usageError marks a bad command line: regnode says so, points at --help and
// exits 2 (a failure to run exits 1).
type usageError struct{ error }

// flagOf is the flag of each node.Config field whose refusal names it
// (configerr.Error.Field), so that a usage error names what to change on
// the command line.
var flagOf = map[string]string{
	"Listen": "--listen", "AdvertiseAddress": "--advertise-address", "MetricsListen": "--metrics-listen", "EtcdEndpoints": "--etcd-endpoints",
	"SessionTTL": "--session-ttl", "Prefix": "--prefix", "ProbeInterval": "--probe-interval",
	"ProbeTimeout": "--probe-timeout", "ProbeConcurrency": "--probe-concurrency",
	"Zone": "--zone", "MassDemotionShare": "--mass-demotion-share", "MassDemotionWindow": "--mass-demotion-window",
	"ReportQuorum": "--report-quorum", "ReportWindow": "--report-window",
	"RingSize": "--watch-ring-size", "QueueSize": "--watch-queue-size", "ShutdownGrace": "--shutdown-grace",
	"Thresholds.FailuresToDegraded": "--degrade-after", "Thresholds.FailuresToUnavailable": "--unavailable-after",
	"Thresholds.SuccessesToHealthy": "--recover-after", "Thresholds.SuccessesToDegraded": "--revive-after",
	"Thresholds.Slow":          "--slow-threshold",
	"Limits.WriteRate":         "--write-rate",
	"Limits.WriteBurst":        "--write-burst",
	"Limits.KeepAliveRate":     "--keepalive-rate",
	"Limits.KeepAliveBurst":    "--keepalive-burst",
	"Limits.MaxStreams":        "--max-streams-per-peer",
	"Limits.MaxRegistrations":  "--max-registrations-per-peer",
	"Limits.MaxWritesInFlight": "--max-writes-in-flight-per-peer",
	"MaxRequestBytes":          "--max-request-bytes",
	"MaxResponseBytes":         "--max-response-bytes",
	"OperatorDeregister":       "--operator-deregister",
	"Embed.ClusterState":       "--initial-cluster-state",
	"DNS.Listen":               "--dns-listen",
	"DNS.Domain":               "--dns-domain",
	"DNS.TTL":                  "--dns-ttl",
	"DNS.Rate":                 "--dns-rate",
}

// withFlag prefixes a refusal of a Config field with its flag:
// "--write-burst: node: Config.Limits.WriteBurst must be at least 1, got 0".
func withFlag(err error) error {
	var ce *configerr.Error
	if errors.As(err, &ce) {
		if flag, ok := flagOf[ce.Field]; ok {
			return fmt.Errorf("%s: %w", flag, err)
		}
	}
	return err
}

func run(args []string) int {
	cfg := node.DefaultConfig()
	var (
		logLevel        string
		groupCommit     bool
		listenClient    []string
		advertiseClient []string
		listenPeer      []string
		advertisePeer   []string
		passwordFile    string
	)
	cmd := &cobra.Command{
		Use:   "regnode",
		Short: "Run a registry node (embedded etcd by default)",
		Long: `regnode serves the registry.v1 API. With no flags it embeds one etcd member
(data in ./regnode.data) and listens on 127.0.0.1:7400. --etcd-endpoints makes
it a client of an external etcd cluster; --name/--initial-cluster and the URL
flags let several regnodes embed the members of one etcd cluster.
Every flag is also read from REGNODE_<FLAG>, e.g. REGNODE_LISTEN.`,
		Args: func(cmd *cobra.Command, args []string) error {
			if err := cobra.NoArgs(cmd, args); err != nil {
				return usageError{err}
			}
			return nil
		},
		SilenceUsage:  true,
		SilenceErrors: true,
		RunE: func(cmd *cobra.Command, _ []string) error {
			if err := fromEnv(cmd.Flags()); err != nil {
				return usageError{err}
			}
			level, err := parseLevel(logLevel)
			if err != nil {
				return usageError{err}
			}
			cfg.NoGroupCommit = !groupCommit
			cfg.Embed.ListenClientURLs, cfg.Embed.AdvertiseClientURLs = listenClient, advertiseClient
			cfg.Embed.ListenPeerURLs, cfg.Embed.AdvertisePeerURLs = listenPeer, advertisePeer
			if cfg.Name != "" {
				cfg.Embed.Name = cfg.Name
			}
			cfg.Embed.LogLevel = "warn"
			if level == slog.LevelDebug {
				cfg.Embed.LogLevel = "info"
			}
			cfg.Logger = slog.New(slog.NewTextHandler(os.Stderr, &slog.HandlerOptions{Level: level}))
			if cfg.EtcdPassword, err = etcdPassword(passwordFile); err != nil {
				return usageError{err}
			}
			embedAuthDefault(cmd.Flags(), &cfg)
			if err := cfg.Validate(); err != nil {
				return usageError{withFlag(err)}
			}
			if err := dnsFlags(cfg); err != nil {
				return usageError{withFlag(err)}
			}
			return serve(cmd.Context(), cfg)
		},
	}
	cmd.Version = buildinfo.Read().String()
	cmd.SetVersionTemplate("regnode {{.Version}}\n")
	f := cmd.Flags()
	f.StringVar(&cfg.Listen, "listen", cfg.Listen, "gRPC API address host:port")
	f.StringVar(&cfg.AdvertiseAddress, "advertise-address", "", "API address host:port other regnodes dial to reach this one, announced for drain --wait (default: --listen; for 0.0.0.0 or ::, the address of this host's default route, or its one address; refused if neither is clear)")
	f.StringVar(&cfg.Embed.Dir, "data-dir", cfg.Embed.Dir, "embedded etcd data directory")
	f.Int64Var(&cfg.Embed.QuotaBackendBytes, "quota-backend-bytes", 0, "embedded etcd's space quota in bytes (0: etcd's 2 GiB); past it writes get ResourceExhausted, reads go on")
	f.StringSliceVar(&cfg.EtcdEndpoints, "etcd-endpoints", nil, "use this external etcd cluster (URL,...); embed nothing")
	f.StringVar(&cfg.Name, "name", "", "member name when embedding; also this regnode's name (default \"default\")")
	f.StringVar(&cfg.Embed.InitialCluster, "initial-cluster", "", "members of the embedded cluster, NAME=PEER_URL,...")
	// The embedded member's flags show embedded.DefaultConfig's values.
	emb := embedded.DefaultConfig()
	f.StringVar(&cfg.Embed.ClusterState, "initial-cluster-state", emb.ClusterState, "new or existing")
	f.StringVar(&cfg.Embed.Token, "initial-cluster-token", emb.Token, "token that keeps separate clusters apart")
	f.StringSliceVar(&listenClient, "listen-client-urls", emb.ListenClientURLs, "embedded etcd client URLs")
	f.StringSliceVar(&advertiseClient, "advertise-client-urls", nil, "client URLs told to the cluster (default: --listen-client-urls)")
	f.StringSliceVar(&listenPeer, "listen-peer-urls", emb.ListenPeerURLs, "embedded etcd peer URLs")
	f.StringSliceVar(&advertisePeer, "initial-advertise-peer-urls", nil, "peer URLs told to the cluster (default: --listen-peer-urls)")
	f.StringVar(&cfg.Prefix, "prefix", cfg.Prefix, "etcd key prefix")
	f.DurationVar(&cfg.SessionTTL, "session-ttl", cfg.SessionTTL, "prober election session TTL")
	f.StringVar(&logLevel, "log-level", "info", "debug|info|warn|error")
	f.StringVar(&cfg.MetricsListen, "metrics-listen", cfg.MetricsListen, "Prometheus /metrics address, or \"off\"")
	f.BoolVar(&cfg.EnablePprof, "enable-pprof", false, "serve Go's runtime profiles under /debug/pprof/ on --metrics-listen (as etcd's flag)")
	f.DurationVar(&cfg.ProbeInterval, "probe-interval", cfg.ProbeInterval, "probe interval of instances whose check does not set one")
	f.DurationVar(&cfg.ProbeTimeout, "probe-timeout", cfg.ProbeTimeout, "probe timeout of instances whose check does not set one")
	f.IntVar(&cfg.ProbeConcurrency, "probe-concurrency", cfg.ProbeConcurrency, "probes in flight at most")
	f.StringVar(&cfg.Zone, "zone", "", "this regnode's zone: evictions are confirmed by a regnode of another zone where there is one")
	f.Float64Var(&cfg.MassDemotionShare, "mass-demotion-share", 0.5, "share of one service's or zone's checked instances that may be evicted within --mass-demotion-window, past which one more per sixth of it (negative: no limit)")
	f.DurationVar(&cfg.MassDemotionWindow, "mass-demotion-window", time.Minute, "the window of --mass-demotion-share")
	f.IntVar(&cfg.ReportQuorum, "report-quorum", cfg.ReportQuorum, "distinct callers reporting an instance's calls failing (while their calls to its peers succeed) that make its owner probe it at once, and DEGRADED if its probes pass")
	f.DurationVar(&cfg.ReportWindow, "report-window", cfg.ReportWindow, "how long a caller's report counts")
	f.IntVar(&cfg.Thresholds.FailuresToDegraded, "degrade-after", cfg.Thresholds.FailuresToDegraded, "HEALTHY -> DEGRADED after this many consecutive failed or slow probes")
	f.IntVar(&cfg.Thresholds.FailuresToUnavailable, "unavailable-after", cfg.Thresholds.FailuresToUnavailable, "DEGRADED -> UNAVAILABLE after this many consecutive failures")
	f.IntVar(&cfg.Thresholds.SuccessesToHealthy, "recover-after", cfg.Thresholds.SuccessesToHealthy, "DEGRADED -> HEALTHY after this many consecutive successes")
	f.IntVar(&cfg.Thresholds.SuccessesToDegraded, "revive-after", cfg.Thresholds.SuccessesToDegraded, "UNAVAILABLE -> DEGRADED after this many consecutive responses")
	f.DurationVar(&cfg.Thresholds.Slow, "slow-threshold", cfg.Thresholds.Slow, "a probe slower than this counts as degraded")
	f.IntVar(&cfg.RingSize, "watch-ring-size", cfg.RingSize, "recent events kept to resume subscribers without a reset")
	f.IntVar(&cfg.QueueSize, "watch-queue-size", cfg.QueueSize, "messages queued per subscriber before it is reset")
	f.DurationVar(&cfg.ShutdownGrace, "shutdown-grace", cfg.ShutdownGrace, "how long calls in flight may finish on shutdown")
	f.Float64Var(&cfg.Limits.WriteRate, "write-rate", cfg.Limits.WriteRate, "Register, Deregister, Drain and Undrain calls per second per peer address")
	f.IntVar(&cfg.Limits.WriteBurst, "write-burst", cfg.Limits.WriteBurst, "writes a peer may make at once before --write-rate applies")
	f.Float64Var(&cfg.Limits.KeepAliveRate, "keepalive-rate", cfg.Limits.KeepAliveRate, "lease renewals per second per peer address")
	f.IntVar(&cfg.Limits.KeepAliveBurst, "keepalive-burst", cfg.Limits.KeepAliveBurst, "renewals a peer may make at once before --keepalive-rate applies")
	f.IntVar(&cfg.Limits.MaxStreams, "max-streams-per-peer", cfg.Limits.MaxStreams, "concurrent Watch and KeepAlive streams per peer address")
	f.IntVar(&cfg.Limits.MaxRegistrations, "max-registrations-per-peer", cfg.Limits.MaxRegistrations, "registrations one peer address may hold through this regnode at once (each regnode counts its own; a restart forgets)")
	f.IntVar(&cfg.Limits.MaxWritesInFlight, "max-writes-in-flight-per-peer", cfg.Limits.MaxWritesInFlight, "writes of one peer address running at once; more wait their turn (none is refused for it)")
	f.Uint32Var(&cfg.MaxConcurrentStreams, "max-concurrent-streams", cfg.MaxConcurrentStreams, "calls and streams in flight on one client connection to the API (HTTP/2 MAX_CONCURRENT_STREAMS; a client past it waits)")
	f.IntVar(&cfg.MaxRequestBytes, "max-request-bytes", cfg.MaxRequestBytes, fmt.Sprintf("largest message a client may send to the API (at least %d; larger: ResourceExhausted)", node.MinRequestBytes))
	f.IntVar(&cfg.MaxResponseBytes, "max-response-bytes", cfg.MaxResponseBytes, fmt.Sprintf("largest message the API sends (at least %d; List pages and Watch chunks are about 1 MiB)", node.MinResponseBytes))
	f.BoolVar(&groupCommit, "group-commit", true, "commit concurrent Registers as one etcd transaction, each with its own compares and lease (--group-commit=false: one transaction each)")
	// DNS (package dnsapi): off unless --dns-listen.
	f.StringVar(&cfg.DNS.Listen, "dns-listen", "", "serve the registry over DNS on this host:port, UDP and TCP (off unless given; a non-loopback address needs --insecure)")
	f.StringVar(&cfg.DNS.Domain, "dns-domain", cfg.DNS.Domain, "DNS zone served: S.service.<domain> A/AAAA, _S._tcp.service.<domain> SRV, Z.S.service.<domain> for zone Z")
	f.DurationVar(&cfg.DNS.TTL, "dns-ttl", cfg.DNS.TTL, "TTL of DNS records and of negative answers (whole seconds, 1s..1h)")
	f.Float64Var(&cfg.DNS.Rate, "dns-rate", cfg.DNS.Rate, "DNS queries per second per source IP address (burst: one second's worth); past it queries are dropped")
	f.StringVar(&cfg.OperatorDeregister, "operator-deregister", cfg.OperatorDeregister, "who may deregister without the registration's secret: loopback (callers on this host) or none")
	// TLS of the API and the HTTP port: etcd's names and meanings.
	f.StringVar(&cfg.TLS.CertFile, "cert-file", "", "serve the API and the metrics port over TLS with this certificate (PEM; re-read when it changes)")
	f.StringVar(&cfg.TLS.KeyFile, "key-file", "", "private key of --cert-file (PEM)")
	f.StringVar(&cfg.TLS.TrustedCAFile, "trusted-ca-file", "", "require client certificates of this CA (PEM), as etcd does")
	f.BoolVar(&cfg.TLS.ClientCertAuth, "client-cert-auth", false, "require a client certificate of --trusted-ca-file")
	f.BoolVar(&cfg.Auth, "auth", cfg.Auth, "require a scoped token on every registry call; the first start writes an admin token to <data-dir>/"+node.AdminTokenFile+" (or --admin-token-file), mode 0600")
	f.StringVar(&cfg.AdminTokenFile, "admin-token-file", cfg.AdminTokenFile, "with --auth: where the first start writes the first admin token (default <data-dir>/"+node.AdminTokenFile+", with --etcd-endpoints too)")
	f.BoolVar(&cfg.Insecure, "insecure", false, "allow listening on a non-loopback address without TLS")
	// This regnode as a client of etcd (external, or its embedded member
	// serving https): etcdctl's names behind "etcd-".
	f.StringVar(&cfg.EtcdTLS.CAFile, "etcd-cacert", "", "CA of etcd's certificate (PEM)")
	f.StringVar(&cfg.EtcdTLS.CertFile, "etcd-cert", "", "client certificate presented to etcd (PEM)")
	f.StringVar(&cfg.EtcdTLS.KeyFile, "etcd-key", "", "private key of --etcd-cert (PEM)")
	f.StringVar(&cfg.EtcdUsername, "etcd-username", "", "etcd user; the password comes from --etcd-password-file or $"+envEtcdPassword)
	f.StringVar(&passwordFile, "etcd-password-file", "", "file holding the etcd user's password (one line)")
	// The embedded member's client port. etcd calls these --cert-file...,
	// names the registry API has taken: "etcd-server-" says whose they are.
	f.StringVar(&cfg.Embed.ClientTLS.CertFile, "etcd-server-cert-file", "", "embedded etcd: certificate of its client port (https --listen-client-urls)")
	f.StringVar(&cfg.Embed.ClientTLS.KeyFile, "etcd-server-key-file", "", "embedded etcd: private key of --etcd-server-cert-file")
	f.StringVar(&cfg.Embed.ClientTLS.TrustedCAFile, "etcd-server-trusted-ca-file", "", "embedded etcd: require client certificates of this CA on its client port")
	f.BoolVar(&cfg.Embed.ClientTLS.ClientCertAuth, "etcd-server-client-cert-auth", false, "embedded etcd: require a client certificate of --etcd-server-trusted-ca-file")
	f.BoolVar(&cfg.EmbedAuth, "etcd-server-auth", false, "embedded etcd: turn etcd's auth on, so its client port refuses clients without credentials (password generated into the data dir, or --etcd-username/--etcd-password-file); on by default with --auth (--etcd-server-auth=false: off, with a warning)")
	// Between embedded members: etcd's own names.
	f.StringVar(&cfg.Embed.PeerTLS.CertFile, "peer-cert-file", "", "embedded etcd: peer certificate (https --listen-peer-urls), also presented to peers")
	f.StringVar(&cfg.Embed.PeerTLS.KeyFile, "peer-key-file", "", "embedded etcd: private key of --peer-cert-file")
	f.StringVar(&cfg.Embed.PeerTLS.TrustedCAFile, "peer-trusted-ca-file", "", "embedded etcd: require peer certificates of this CA")
	f.BoolVar(&cfg.Embed.PeerTLS.ClientCertAuth, "peer-client-cert-auth", false, "embedded etcd: require a peer certificate of --peer-trusted-ca-file")
	cmd.SetFlagErrorFunc(func(_ *cobra.Command, err error) error { return usageError{err} })
	cmd.SetArgs(args)

	ctx, stop := signal.NotifyContext(context.Background(), syscall.SIGINT, syscall.SIGTERM)
	defer stop()
	// After the first signal the default action comes back, so a second
	// one ends a stop that hangs (an etcd that will not close).
	context.AfterFunc(ctx, stop)
	if err := cmd.ExecuteContext(ctx); err != nil {
		fmt.Fprintf(os.Stderr, "regnode: %v\n", err)
		var ue usageError
		if errors.As(err, &ue) {
			fmt.Fprintln(os.Stderr, "Run 'regnode --help' for usage.")
			return 2
		}
		return 1
	}
	return 0
}

func serve(ctx context.Context, cfg node.Config) error {
	n, err := node.Start(ctx, cfg)
	if err != nil {
		if ctx.Err() != nil {
			// A signal during start-up is a clean stop, whatever stage
			// start-up had reached (Start undid it).
			cfg.Logger.Info("signal received during start-up; stopped", "stage_err", err)
			return nil
		}
		return err
	}
	fmt.Fprintf(os.Stderr, "regnode %s: registry API on %s, metrics on %s, DNS on %s\n", n.Name(), n.Addr(), orOff(n.MetricsAddr()), orOff(n.DNSAddr()))
	var runErr error
	select {
	case <-ctx.Done():
		cfg.Logger.Info("signal received; stopping")
	case runErr = <-n.Err():
		cfg.Logger.Error("stopping after a failure", "err", runErr)
	}
	if err := n.Close(); err != nil && runErr == nil {
		runErr = err
	}
	return runErr
}

// dnsFlags refuses a bad --dns-domain, --dns-ttl or --dns-rate even
// without --dns-listen (node.Config.Validate checks them only when DNS is
// on), so a typo does not wait for the day DNS is turned on.
func dnsFlags(cfg node.Config) error {
	if cfg.DNS.Listen != "" {
		return nil // checked by Validate
	}
	d := cfg.DNS
	d.Listen = "127.0.0.1:0"
	return configerr.Within(node.ErrInvalidConfig, "node", "DNS", d.Validate())
}

func orOff(s string) string {
	if s == "" {
		return "off"
	}
	return s
}

// envEtcdServerAuth is --etcd-server-auth's variable: given, it is as
// explicit as the flag.
const envEtcdServerAuth = "REGNODE_ETCD_SERVER_AUTH"

// embedAuthDefault makes --auth secure by default: on an embedded member
// it turns etcd's own auth on too (else anyone reaching the member's
// client port reads and writes the registry behind the tokens' back),
// unless --etcd-server-auth=false says otherwise, which is logged as a
// warning.
func embedAuthDefault(fs *pflag.FlagSet, cfg *node.Config) {
	if !cfg.Auth || len(cfg.EtcdEndpoints) > 0 {
		return
	}
	_, inEnv := os.LookupEnv(envEtcdServerAuth)
	if !fs.Changed("etcd-server-auth") && !inEnv {
		cfg.EmbedAuth = true
		return
	}
	if !cfg.EmbedAuth {
		cfg.Logger.Warn("--auth with --etcd-server-auth=false: the embedded etcd's client port is open to anyone who can reach it, "+
			"who can read and write the registry there without a token", "listen_client_urls", strings.Join(cfg.Embed.ListenClientURLs, ","))
	}
}

// fromEnv sets every flag not given on the command line from REGNODE_<FLAG>.
func fromEnv(fs *pflag.FlagSet) error {
	var err error
	fs.VisitAll(func(f *pflag.Flag) {
		if err != nil || f.Changed || f.Name == "help" {
			return
		}
		name := "REGNODE_" + strings.ToUpper(strings.ReplaceAll(f.Name, "-", "_"))
		if v, ok := os.LookupEnv(name); ok {
			if sv, isSlice := f.Value.(pflag.SliceValue); isSlice {
				err = sv.Replace(strings.Split(v, ","))
			} else {
				err = f.Value.Set(v)
			}
			if err != nil {
				err = fmt.Errorf("%s=%q: %w", name, v, err)
			}
		}
	})
	return err
}

// envEtcdPassword holds the etcd password when no file does: there is no
// flag, so it never shows in ps.
const envEtcdPassword = "REGNODE_ETCD_PASSWORD"

// etcdPassword reads the password from file, else $REGNODE_ETCD_PASSWORD.
// Only the line ending is trimmed from the file.
func etcdPassword(file string) (string, error) {
	env, inEnv := os.LookupEnv(envEtcdPassword)
	if file == "" {
		return env, nil
	}
	if inEnv {
		return "", fmt.Errorf("the etcd password is given twice: --etcd-password-file and $%s (keep one)", envEtcdPassword)
	}
	b, err := os.ReadFile(file)
	if err != nil {
		return "", fmt.Errorf("--etcd-password-file: %w", err)
	}
	return strings.TrimRight(string(b), "\r\n"), nil
}

func parseLevel(s string) (slog.Level, error) {
	switch strings.ToLower(s) {
	case "debug":
		return slog.LevelDebug, nil
	case "info":
		return slog.LevelInfo, nil
	case "warn":
		return slog.LevelWarn, nil
	case "error":
		return slog.LevelError, nil
	}
	return 0, fmt.Errorf("--log-level %q must be debug, info, warn or error", s)
}
