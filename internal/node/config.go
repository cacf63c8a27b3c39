package node

import (
	"fmt"
	"log/slog"
	"net"
	"strings"
	"time"

	"google.golang.org/grpc/keepalive"

	"github.com/regcluster/registry/dnsapi"
	"github.com/regcluster/registry/health"
	"github.com/regcluster/registry/internal/chunk"
	"github.com/regcluster/registry/internal/configerr"
	"github.com/regcluster/registry/internal/embedded"
	"github.com/regcluster/registry/internal/peerlimit"
	"github.com/regcluster/registry/internal/tlsfiles"
	"github.com/regcluster/registry/record"
)

// Config is everything a regnode needs. DefaultConfig gives the values of
// `regnode` with no flags.
type Config struct {
	// Listen is the API address (default 127.0.0.1:7400; port 0 picks one).
	Listen string
	// AdvertiseAddress is the API address other regnodes dial to reach
	// this one (host:port, a port of 1..65535, a host that is not
	// unspecified), announced under <prefix>nodes/ so that a WaitApplied
	// anywhere asks this regnode for its subscribers
	// (--advertise-address). Empty: Listen as bound (its port 0 is the
	// port picked), or, when Listen's host is unspecified (0.0.0.0, ::
	// or empty), this host's one address (see AdvertiseHost), with the
	// port bound; a regnode that cannot tell which address that is
	// refuses to start.
	AdvertiseAddress string
	// MetricsListen serves /metrics (default 127.0.0.1:7401; "off"
	// disables it; port 0 picks one).
	MetricsListen string
	// EnablePprof serves Go's runtime profiles (net/http/pprof) under
	// /debug/pprof/ on MetricsListen (--enable-pprof, etcd's flag). Off by
	// default: a profile shows what the process holds to whoever can reach
	// the port.
	EnablePprof bool
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
	// Zone is this regnode's zone, announced to its peers: an eviction is
	// confirmed by a regnode of another zone where there is one ("":
	// none).
	Zone string
	// MassDemotionShare is the share of one service's (or zone's)
	// checked instances that may be evicted within MassDemotionWindow,
	// past which one more per sixth of the window (0: 0.5; negative: no
	// limit); see prober.Config.MassShare.
	MassDemotionShare float64
	// MassDemotionWindow is that window (0: 1m).
	MassDemotionWindow time.Duration
	// ReportQuorum is how many distinct callers must report an instance
	// failing (while their calls to its peers succeed) within
	// ReportWindow for its owner to probe it at once and, if its probes
	// pass, make it DEGRADED (0: 3); ReportWindow is how long a report
	// counts (0: 30s).
	ReportQuorum int
	ReportWindow time.Duration
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
	// else user root (in a cluster of several members, a user of each
	// member's own, with the root role) with a password generated on the
	// first start and kept in the data dir (RootPasswordFile, mode 0600).
	// regnode --auth sets it unless --etcd-server-auth=false is given.
	EmbedAuth bool
	// NoGroupCommit gives every Register an etcd Txn of its own
	// (--group-commit=false). By default concurrent Registers are
	// committed as one Txn (internal/txnbatch): one raft proposal for many
	// registrations, each still with its own compares, outcome and lease.
	// (A negative name, so that the zero Config is what regnode runs: as
	// GroupCommit it was off in every Config built field by field, the
	// tests' and regbench's.)
	NoGroupCommit bool
	// Auth turns scoped tokens on (--auth): every registry.v1 call needs
	// a token whose role and scope allow it (see package token). The
	// first start writes an admin token to AdminTokenFile.
	Auth bool
	// AdminTokenFile is where the first admin token is written (default
	// <data dir>/admin-token, with an external etcd too).
	AdminTokenFile string
	// DNS serves the registry over DNS (package dnsapi) when DNS.Listen
	// is set (--dns-listen; off by default), from the fan-out's view.
	// Its other fields are --dns-domain, --dns-ttl and --dns-rate; they
	// are checked only when DNS.Listen is set, and a zero one is refused,
	// not defaulted: start from DefaultConfig (whose DNS is
	// dnsapi.DefaultConfig()). Its View, Ready, Logger and OnQuery are
	// the node's own.
	DNS dnsapi.Config
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

// receiveWindow is the regnode's HTTP/2 receive window, per stream and
// per connection, fixed. Fixed because gRPC's default, a window grown by
// BDP estimation, answers each burst of data a client sends with a ping
// the client must answer: with xDS clients ACKing every response, a ping
// round trip per ACK of every stream (four syscalls across the two ends,
// as many as the ACK's own). Requests are small (MaxRequestBytes), so the
// estimation buys nothing; 1 MiB holds the largest many times over, and
// is below the 16 MiB the estimation may grow a connection's window to.
const receiveWindow = 1 << 20

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
		ReportQuorum:     3,
		ReportWindow:     30 * time.Second,
		RingSize:         10000,
		QueueSize:        1024,
		Thresholds:       health.DefaultThresholds(),
		Limits:           peerlimit.DefaultConfig(),

		MaxConcurrentStreams: DefaultMaxConcurrentStreams,
		MaxRequestBytes:      DefaultMaxRequestBytes,
		MaxResponseBytes:     DefaultMaxResponseBytes,

		OperatorDeregister: "loopback",

		DNS: dnsapi.DefaultConfig(),
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
	if err := c.validateAdvertise(); err != nil {
		return err
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
	if len(c.Zone) > record.MaxZoneLen {
		return invalid("Zone", c.Zone, fmt.Sprintf("must be at most %d characters", record.MaxZoneLen))
	}
	if c.ReportQuorum < 0 {
		return invalid("ReportQuorum", c.ReportQuorum, "must be >= 0 (0: the default 3)")
	}
	if c.ReportWindow < 0 {
		return invalid("ReportWindow", c.ReportWindow, "must be >= 0 (0: the default 30s)")
	}
	if c.MassDemotionWindow < 0 {
		return invalid("MassDemotionWindow", c.MassDemotionWindow, "must be >= 0 (0: the default 1m)")
	}
	if c.MassDemotionShare > 1 {
		return invalid("MassDemotionShare", c.MassDemotionShare, "must be at most 1 (0: the default 0.5; negative: no limit)")
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
	if c.DNS.Listen != "" {
		if err := c.DNS.Validate(); err != nil {
			return configerr.Within(ErrInvalidConfig, "node", "DNS", err)
		}
	}
	return c.validateSecurity()
}
