package probe

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"net/http"
	"strings"
	"sync"
	"time"

	"google.golang.org/grpc"

	"github.com/regcluster/registry/health"
	"github.com/regcluster/registry/internal/configerr"
	registryv1 "github.com/regcluster/registry/proto/registry/v1"
)

// DefaultTimeout is the probe timeout when neither the check spec nor the
// Config sets one.
const DefaultTimeout = 500 * time.Millisecond

// ErrInvalidConfig is wrapped by every error of Config.Validate, and so
// of New (see package configerr).
var ErrInvalidConfig = errors.New("probe: invalid config")

// Config configures a Checker. The zero Config is valid: a zero field
// takes the default its comment states (DefaultConfig has them all).
type Config struct {
	// DefaultTimeout bounds a probe whose check spec sets no timeout
	// (0: DefaultTimeout, 500ms: well under the default 1s interval, so
	// a hung target fails its probe before the next one is due); it must
	// not be negative.
	DefaultTimeout time.Duration
	// HTTPClient, if set, sends HTTP probes instead of the Checker's own
	// client. The Checker uses a copy that never follows redirects, and
	// leaves the client's transport open on Close: the caller owns it.
	HTTPClient *http.Client
	// GRPCDialOptions are added to the options of every gRPC ClientConn
	// the Checker creates (after its own: plaintext, no proxy, a connect
	// backoff capped at one second).
	GRPCDialOptions []grpc.DialOption
	// Logger receives the Checker's own troubles, never probe results
	// (nil: slog.Default()).
	Logger *slog.Logger
	// Agent says who sends the probes, so that an instance's logs tell
	// which regnode probed it: HTTP probes send Agent.String() as their
	// User-Agent, gRPC probes as the start of theirs (grpc-go appends
	// its own name) and Agent.Node as metadata x-registry-prober. A zero
	// field takes DefaultAgent's.
	Agent Agent
}

// Agent names the sender of probes.
type Agent struct {
	// Version is the sender's version, a product version without spaces
	// ("0.1.0"; "": DefaultAgent's).
	Version string
	// Node is the sender's name, the regnode's --name ("": DefaultAgent's).
	// It is sent in an HTTP header and gRPC metadata, so it must be
	// printable ASCII, without parentheses or backslashes.
	Node string
}

// DefaultAgent is what an Agent's zero fields are.
var DefaultAgent = Agent{Version: "unknown", Node: "unnamed"}

// String is the User-Agent of probes: "regnode/<version> (<node>)".
func (a Agent) String() string { return "regnode/" + a.Version + " (" + a.Node + ")" }

// maxAgentField bounds Agent's fields: they are sent with every probe.
const maxAgentField = 128

// agentField reports what is wrong with s as an Agent field ("" if it is
// fine): HTTP header values and gRPC metadata take printable ASCII only,
// and the version is a product token, the node a User-Agent comment.
func agentField(s string, space bool) string {
	if len(s) > maxAgentField {
		return fmt.Sprintf("must be at most %d bytes", maxAgentField)
	}
	for _, r := range s {
		if r < 0x20 || r > 0x7e || (r == ' ' && !space) || strings.ContainsRune("()\\", r) {
			if space {
				return "must be printable ASCII without parentheses or backslashes"
			}
			return "must be printable ASCII without spaces, parentheses or backslashes"
		}
	}
	return ""
}

// DefaultConfig is the zero Config with its defaults stated.
func DefaultConfig() Config { return Config{DefaultTimeout: DefaultTimeout, Agent: DefaultAgent} }

// withDefaults is c with its zero fields set to DefaultConfig's: the one
// place defaults are filled, for Validate and New.
func (c Config) withDefaults() Config {
	if c.DefaultTimeout == 0 {
		c.DefaultTimeout = DefaultConfig().DefaultTimeout
	}
	if c.Logger == nil {
		c.Logger = slog.Default()
	}
	if c.Agent.Version == "" {
		c.Agent.Version = DefaultAgent.Version
	}
	if c.Agent.Node == "" {
		c.Agent.Node = DefaultAgent.Node
	}
	return c
}

// Validate reports the first field that cannot work, with its defaults
// filled, as a *configerr.Error wrapping ErrInvalidConfig.
func (c Config) Validate() error {
	c = c.withDefaults()
	if c.DefaultTimeout < 0 {
		return configerr.New(ErrInvalidConfig, "probe", "DefaultTimeout", c.DefaultTimeout, "must be >= 0 (0: the default)")
	}
	if why := agentField(c.Agent.Version, false); why != "" {
		return configerr.New(ErrInvalidConfig, "probe", "Agent.Version", c.Agent.Version, why)
	}
	if why := agentField(c.Agent.Node, true); why != "" {
		return configerr.New(ErrInvalidConfig, "probe", "Agent.Node", c.Agent.Node, why)
	}
	return nil
}

// Checker runs probes. Create it with New and Close it when done.
type Checker struct {
	timeout   time.Duration
	agent     Agent
	userAgent string // agent.String()
	http      *http.Client
	transport *http.Transport // the Checker's own, closed by Close; nil if Config.HTTPClient
	dialer    net.Dialer
	noLinger  bool // TCP probes close with a FIN: only for the benchmarks' comparison
	grpcOpts  []grpc.DialOption
	grpcMax   int           // gRPC connections cached at most
	grpcIdle  time.Duration // a cached gRPC connection unused this long is closed
	log       *slog.Logger

	inflight sync.WaitGroup // probes running; Close waits for them
	sweeper  sync.WaitGroup // the idle gRPC connections' sweeper; Close waits for it

	mu struct {
		sync.Mutex
		closed bool
		conns  map[string]*grpcConn // by address
		stop   chan struct{}        // stops the sweeper; nil until it runs
	}
}

// New returns a Checker configured by cfg; it fails only if cfg does not
// Validate. It does no I/O and starts no goroutine: the first cached gRPC
// connection starts the one that closes idle ones.
func New(cfg Config) (*Checker, error) {
	if err := cfg.Validate(); err != nil {
		return nil, err
	}
	cfg = cfg.withDefaults()
	p := &Checker{
		timeout:   cfg.DefaultTimeout,
		agent:     cfg.Agent,
		userAgent: cfg.Agent.String(),
		grpcMax:   maxGRPCConns,
		grpcIdle:  idleConnTimeout,
		log:       cfg.Logger,
	}
	if cfg.HTTPClient != nil {
		c := *cfg.HTTPClient
		c.CheckRedirect = noRedirect
		p.http = &c
	} else {
		p.transport = newTransport()
		p.http = &http.Client{Transport: p.transport, CheckRedirect: noRedirect}
	}
	p.grpcOpts = append(grpcDialOptions(p.userAgent), cfg.GRPCDialOptions...)
	p.mu.conns = make(map[string]*grpcConn)
	return p, nil
}

// Probe checks the instance at address (host:port) as spec says and returns
// the result, classified against slow. It returns within the probe's
// timeout: spec.Timeout if set, else the Config's default, or sooner if ctx
// ends first. A nil spec, or CHECK_KIND_NONE, returns OK at once, with zero
// latency, without any I/O, even on a closed Checker: an instance without a
// check is taken at its word. Otherwise a canceled ctx gives an Error
// ("probe canceled") that callers shutting down should discard, and a
// closed Checker gives an Error ("prober closed"). Probe is safe for
// concurrent use; probes of one address share its cached connections.
func (p *Checker) Probe(ctx context.Context, address string, spec *registryv1.HealthCheck, slow time.Duration) health.Result {
	start := time.Now()
	kind := spec.GetKind()
	if kind == registryv1.CheckKind_CHECK_KIND_NONE {
		return health.Result{Outcome: health.OK, At: start}
	}
	if !p.begin() {
		return health.Result{Outcome: health.Error, Detail: "prober closed", At: start}
	}
	defer p.inflight.Done()

	timeout := p.timeout
	if d := spec.GetTimeout(); d != nil && d.AsDuration() > 0 {
		timeout = d.AsDuration()
	}
	if dl, ok := ctx.Deadline(); ok {
		timeout = max(min(timeout, dl.Sub(start)), 0)
	}
	ctx, cancel := context.WithTimeout(ctx, timeout)
	defer cancel()

	var outcome health.Outcome
	var detail string
	switch kind {
	case registryv1.CheckKind_CHECK_KIND_TCP:
		outcome, detail = p.probeTCP(ctx, address, timeout)
	case registryv1.CheckKind_CHECK_KIND_HTTP:
		outcome, detail = p.probeHTTP(ctx, address, spec.GetTarget(), timeout)
	case registryv1.CheckKind_CHECK_KIND_GRPC:
		outcome, detail = p.probeGRPC(ctx, address, spec.GetTarget(), timeout)
	default:
		outcome, detail = health.Error, fmt.Sprintf("unsupported check kind %v", kind)
	}
	done := time.Now()
	return health.Classify(health.Result{
		Outcome: outcome,
		Latency: done.Sub(start), // monotonic
		Detail:  detail,
		At:      done,
	}, slow)
}

// begin registers a probe in flight, unless the Checker is closed.
func (p *Checker) begin() bool {
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.mu.closed {
		return false
	}
	p.inflight.Add(1)
	return true
}

// Forget closes and drops the cached gRPC connection to address, if any:
// call it when the instance at address leaves the registry. A probe in
// flight on that connection fails. Idle HTTP keep-alive connections to the
// address are not closed here; they expire after 90 seconds idle.
func (p *Checker) Forget(address string) {
	p.mu.Lock()
	c := p.mu.conns[address]
	delete(p.mu.conns, address)
	p.mu.Unlock()
	if c != nil {
		p.closeConn(address, c.cc)
	}
}

// Close stops the Checker: new probes return "prober closed" at once, Close
// waits for the probes in flight (each ends within its timeout), then stops
// the idle connections' sweeper and closes every cached gRPC connection and
// the idle HTTP connections of the Checker's own transport. Close is
// idempotent; only the first call waits.
func (p *Checker) Close() error {
	p.mu.Lock()
	if p.mu.closed {
		p.mu.Unlock()
		return nil
	}
	p.mu.closed = true
	p.mu.Unlock()

	p.inflight.Wait() // no probe runs now, so none starts the sweeper

	p.mu.Lock()
	conns, stop := p.mu.conns, p.mu.stop
	p.mu.conns = nil
	p.mu.Unlock()
	if stop != nil {
		close(stop)
	}
	p.sweeper.Wait()
	var errs []error
	for addr, c := range conns {
		if err := c.cc.Close(); err != nil {
			errs = append(errs, fmt.Errorf("probe: closing gRPC connection to %s: %w", addr, err))
		}
	}
	if p.transport != nil {
		p.transport.CloseIdleConnections()
	}
	return errors.Join(errs...)
}
