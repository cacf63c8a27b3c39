// Package server implements the registry.v1.Registry API over etcd. Any
// regnode serves any call: state lives in etcd, so an instance keeps its
// lease alive through whichever regnode it reaches, and operators' writes
// are compare-and-swap so they never lose a concurrent update.
//
// Registrations are owned: Register returns a secret, and only its holder
// may keep the lease alive, replace a live record or deregister it as its
// owner (PermissionDenied otherwise, with nothing written). A Deregister
// without the secret is an operator's, allowed by Config.Operator. Writes
// and streams are limited per peer (ResourceExhausted, with a retry hint),
// and every write is logged on one structured audit line.
package server

import (
	"context"
	"errors"
	"fmt"
	"iter"
	"log/slog"
	"slices"
	"strconv"
	"time"

	"go.etcd.io/etcd/api/v3/v3rpc/rpctypes"
	clientv3 "go.etcd.io/etcd/client/v3"
	"google.golang.org/genproto/googleapis/rpc/errdetails"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/protoadapt"
	"google.golang.org/protobuf/types/known/durationpb"

	"github.com/regcluster/registry/cache"
	"github.com/regcluster/registry/internal/chunk"
	"github.com/regcluster/registry/internal/configerr"
	"github.com/regcluster/registry/internal/epoch"
	"github.com/regcluster/registry/internal/fanout"
	"github.com/regcluster/registry/internal/metrics"
	"github.com/regcluster/registry/internal/peerlimit"
	"github.com/regcluster/registry/internal/token"
	registryv1 "github.com/regcluster/registry/proto/registry/v1"
	"github.com/regcluster/registry/record"
	"github.com/regcluster/registry/store"
)

// ErrInvalidConfig is wrapped by every error of Config.Validate and
// TokensConfig.Validate, and so of New and NewTokens (see package
// configerr).
var ErrInvalidConfig = errors.New("server: invalid config")

// Config configures a Server. A zero field takes the default its comment
// states (DefaultConfig has them all).
type Config struct {
	// Store is where records live (required).
	Store *store.Store
	// Metrics receives counters (required; see metrics.New).
	Metrics *metrics.Metrics
	// Node is this regnode's name, reported by Status.
	Node string
	// Embedded says whether this regnode embeds an etcd member.
	Embedded bool
	// Version is reported by Status.
	Version string
	// Leader, if set, returns the name of the prober leader for Status.
	Leader func(context.Context) string
	// Hub serves Watch; without it Watch is Unimplemented.
	Hub *fanout.Hub
	// Logger (nil: slog.Default()).
	Logger *slog.Logger
	// CallTimeout bounds each etcd call made for one request (0: 5s,
	// longer than an etcd leader election, shorter than a client's
	// patience); it must not be negative.
	CallTimeout time.Duration
	// Limits, if set, are the per-peer rate limits and stream caps.
	Limits *peerlimit.Limiter
	// Operator decides whether a Deregister without the registration's
	// secret (an operator removing an instance) is allowed: it returns
	// nil to allow, or an error saying why not (sent as PermissionDenied).
	// nil: LoopbackOperator; with tokens, TokenOperator.
	Operator func(context.Context) error
	// LimitKey names the caller whose buckets of Limits a call takes
	// from (nil: peerlimit.Peer; with tokens, TokenLimitKey).
	LimitKey func(context.Context) string
	// Addr is this regnode's API address, reported by WaitApplied.
	Addr string
	// Peers, if set, lists every regnode of the cluster (this one may be
	// among them): WaitApplied asks each for its subscribers. Nil: a
	// WaitApplied counts this regnode's only.
	Peers func(context.Context) ([]Peer, error)
	// DialPeer connects to another regnode's API at addr; close releases
	// the connection.
	DialPeer func(addr string) (cli registryv1.RegistryClient, close func(), err error)
	// XDS, if set, is this regnode's xDS server: a WaitApplied waits for
	// its clients' acknowledgements as for subscribers' (package xds).
	XDS XDSClients
	// XDSList, if set, lists this regnode's xDS streams for XdsClients
	// (package xds; nil: it has none).
	XDSList XDSLister
	// Confirm, if set, serves ConfirmProbe: a probe of the instance at
	// once from this regnode (nil: Unimplemented).
	Confirm func(context.Context, *registryv1.ConfirmProbeRequest) (*registryv1.ConfirmProbeResponse, error)
	// Probing, if set, reports this regnode's prober for Status.
	Probing func() *registryv1.Probing
	// Report, if set, takes a caller's report (SubscribeReport), checked
	// and rate limited, under the reporter's name.
	Report func(ctx context.Context, reporter string, r *registryv1.SubscribeReport)
	// Forwarded, if set, serves ForwardReports: it must check the peer
	// secret (server.FromPeer) and refuse with PermissionDenied.
	Forwarded func(context.Context, *registryv1.ForwardReportsRequest) error
}

// DefaultConfig is a Config with every default but the required fields.
func DefaultConfig() Config {
	return Config{CallTimeout: 5 * time.Second, Operator: LoopbackOperator, LimitKey: peerlimit.Peer}
}

// withDefaults is c with its zero fields set to DefaultConfig's: the one
// place defaults are filled, for Validate and New.
func (c Config) withDefaults() Config {
	d := DefaultConfig()
	if c.Logger == nil {
		c.Logger = slog.Default()
	}
	if c.CallTimeout == 0 {
		c.CallTimeout = d.CallTimeout
	}
	if c.Operator == nil {
		c.Operator = d.Operator
	}
	if c.LimitKey == nil {
		c.LimitKey = d.LimitKey
	}
	return c
}

// Validate reports the first field that cannot work, with its defaults
// filled, as a *configerr.Error wrapping ErrInvalidConfig.
func (c Config) Validate() error {
	c = c.withDefaults()
	switch {
	case c.Store == nil:
		return configerr.Required(ErrInvalidConfig, "server", "Store")
	case c.Metrics == nil:
		return configerr.Required(ErrInvalidConfig, "server", "Metrics")
	case c.CallTimeout < 0:
		return configerr.New(ErrInvalidConfig, "server", "CallTimeout", c.CallTimeout, "must be >= 0 (0: the default)")
	}
	return nil
}

// LoopbackOperator allows operator calls from this regnode's own host (a
// loopback address or a unix socket) only. Until tokens land that is the
// line that means something: whoever is on the host can as well edit the
// embedded etcd through its client port, and nobody else can be told
// from a stranger.
func LoopbackOperator(ctx context.Context) error {
	if peerlimit.Loopback(ctx) {
		return nil
	}
	return errors.New("operator calls without the registration's secret are allowed from this regnode's host only")
}

// NoOperator allows no operator calls: every Deregister needs the secret.
func NoOperator(context.Context) error {
	return errors.New("operator calls without the registration's secret are off on this regnode")
}

// Server is the Registry service. Its methods are safe for concurrent use.
type Server struct {
	registryv1.UnimplementedRegistryServer
	cfg Config
	st  *store.Store
	m   *metrics.Metrics
	log *slog.Logger
	// subs are the live subscribers of the Subscribe streams (subscribe.go).
	subs subscribers
}

// New returns a Server; it fails only if cfg does not Validate.
func New(cfg Config) (*Server, error) {
	if err := cfg.Validate(); err != nil {
		return nil, err
	}
	cfg = cfg.withDefaults()
	return &Server{cfg: cfg, st: cfg.Store, m: cfg.Metrics, log: cfg.Logger}, nil
}

// toStatus maps an error to the gRPC status a client branches on: the
// field of an invalid input (in the message and as errdetails.BadRequest),
// not found, already exists, not the owner, a limit, out of space;
// otherwise what etcd's answer means to the caller (etcdStatus):
// unavailable when trying again or another regnode can help, internal
// when this regnode asked something wrong or failed on its own.
func toStatus(err error) error {
	if err == nil {
		return nil
	}
	var fe *record.FieldError
	switch {
	case errors.As(err, &fe):
		return fieldStatus(fe)
	case errors.Is(err, record.ErrInvalid):
		return status.Error(codes.InvalidArgument, err.Error())
	case errors.Is(err, record.ErrNotFound):
		return status.Error(codes.NotFound, err.Error())
	case errors.Is(err, record.ErrAlreadyExists):
		return status.Error(codes.AlreadyExists, err.Error())
	case errors.Is(err, store.ErrNotOwner):
		return status.Error(codes.PermissionDenied, err.Error())
	case errors.Is(err, peerlimit.ErrLimited):
		return limitedStatus(err)
	case errors.Is(err, context.Canceled):
		return status.Error(codes.Canceled, err.Error())
	case errors.Is(err, context.DeadlineExceeded):
		return status.Error(codes.DeadlineExceeded, err.Error())
	case noSpace(err):
		return noSpaceStatus(err)
	case errors.Is(err, rpctypes.ErrNoLeader), errors.Is(err, rpctypes.ErrTimeout):
		return status.Error(codes.Unavailable, err.Error())
	}
	return etcdStatus(err)
}

// limitedStatus is ResourceExhausted saying which limit, in its message
// and as an errdetails.ErrorInfo (reason LimitReason), with
// errdetails.RetryInfo when waiting is what helps.
func limitedStatus(err error) error {
	st := status.New(codes.ResourceExhausted, err.Error())
	var le *peerlimit.Error
	if errors.As(err, &le) {
		details := []protoadapt.MessageV1{&errdetails.ErrorInfo{Reason: LimitReason(le.Limit), Domain: ErrorDomain,
			Metadata: map[string]string{"limit": le.Limit}}}
		if le.RetryAfter > 0 {
			details = append(details, &errdetails.RetryInfo{RetryDelay: durationpb.New(le.RetryAfter)})
		}
		if d, derr := st.WithDetails(details...); derr == nil {
			st = d
		}
	}
	return st.Err()
}

// limit refuses a call over one of the peer's limits (take is one of the
// Limiter's methods), counting it; nil when under or without limits.
func (s *Server) limit(ctx context.Context, take func(*peerlimit.Limiter, string) error) error {
	if s.cfg.Limits == nil {
		return nil
	}
	if err := take(s.cfg.Limits, s.cfg.LimitKey(ctx)); err != nil {
		var le *peerlimit.Error
		if errors.As(err, &le) {
			s.m.Limited.WithLabelValues(le.Limit).Inc()
		}
		return toStatus(err)
	}
	return nil
}

// openStream takes a stream slot of the peer for the life of a stream.
func (s *Server) openStream(ctx context.Context) (release func(), err error) {
	if s.cfg.Limits == nil {
		return func() {}, nil
	}
	release, err = s.cfg.Limits.OpenStream(s.cfg.LimitKey(ctx))
	if err != nil {
		s.m.Limited.WithLabelValues(peerlimit.Streams).Inc()
		return nil, toStatus(err)
	}
	return release, nil
}

// audit logs one write on one line: who (the peer), what (the method and
// the instance key), and how it ended (ok or the gRPC code and message).
// Secrets never reach it: no request is logged whole.
func (s *Server) audit(ctx context.Context, method, service, id string, err error, attrs ...slog.Attr) {
	result := "ok"
	if err != nil {
		result = status.Code(err).String()
		attrs = append(attrs, slog.String("error", status.Convert(err).Message()))
	}
	if r, ok := token.FromContext(ctx); ok {
		attrs = append(attrs, slog.String("token", r.Name))
	}
	s.log.LogAttrs(ctx, slog.LevelInfo, "audit",
		append([]slog.Attr{slog.String("peer", peerlimit.Peer(ctx)), slog.String("method", method),
			slog.String("key", service+"/"+id), slog.String("result", result)}, attrs...)...)
}

func (s *Server) callCtx(ctx context.Context) (context.Context, context.CancelFunc) {
	return context.WithTimeout(ctx, s.cfg.CallTimeout)
}

func invalid(field, format string, args ...any) error {
	return toStatus(&record.FieldError{Field: field, Reason: fmt.Sprintf(format, args...)})
}

// Register validates the instance (every rule of docs/architecture.md; nothing is
// written on failure), grants a lease and stores the instance under it.
// The request's secret, if any, must be the registration's to replace a
// live record or carry a lost one's state (AlreadyExists otherwise); the
// response carries the secret, the only time it is ever sent.
func (s *Server) Register(ctx context.Context, req *registryv1.RegisterRequest) (*registryv1.RegisterResponse, error) {
	resp, err := s.register(ctx, req)
	if err != nil {
		s.m.RegistrationErrors.WithLabelValues(status.Code(err).String()).Inc()
		s.audit(ctx, "Register", req.GetInstance().GetService(), req.GetInstance().GetId(), err)
		return nil, err
	}
	s.m.Registrations.Inc()
	s.audit(ctx, "Register", resp.Instance.Service, resp.Instance.Id, nil,
		slog.String("lease", fmt.Sprintf("%x", resp.LeaseId)), slog.Int64("revision", resp.Revision))
	return resp, nil
}

func (s *Server) register(ctx context.Context, req *registryv1.RegisterRequest) (*registryv1.RegisterResponse, error) {
	if err := s.limit(ctx, (*peerlimit.Limiter).Write); err != nil {
		return nil, err
	}
	done, err := s.enterWrite(ctx)
	if err != nil {
		return nil, err
	}
	defer done()
	if req.GetInstance() == nil {
		return nil, invalid("instance", "must be set")
	}
	var ttl time.Duration
	if req.Ttl != nil {
		if err := req.Ttl.CheckValid(); err != nil {
			return nil, invalid("ttl", "%v", err)
		}
		ttl = req.Ttl.AsDuration()
		if ttl == 0 {
			return nil, invalid("ttl", "0s is outside %s..%s (omit it for the default %s)", record.MinTTL, record.MaxTTL, record.DefaultTTL)
		}
	}
	held, err := s.reserve(ctx, req.Instance)
	if err != nil {
		return nil, err
	}
	ctx, cancel := s.callCtx(ctx)
	defer cancel()
	reg, err := s.st.RegisterAs(ctx, req.Secret, req.Instance, ttl)
	if err != nil {
		held.cancel()
		return nil, toStatus(err)
	}
	held.granted(reg.LeaseID, reg.Revision)
	if reg.Replaced {
		s.m.ReRegistrations.Inc()
	}
	return &registryv1.RegisterResponse{LeaseId: reg.LeaseID, Revision: reg.Revision,
		TtlSeconds: int64(reg.TTL / time.Second), Instance: reg.Instance, Secret: reg.Secret}, nil
}

// KeepAlive renews leases, one response per request, for as long as the
// client keeps the stream open. Each request names its registration
// (service, id) and carries its secret: only the lease that record is
// under is renewed, and only for its owner (PermissionDenied ends the
// stream otherwise). A lease that no longer exists, or is not the
// record's, is answered with lost=true (the client registers again); an
// etcd failure ends the stream with Unavailable so the client retries, on
// this or another regnode.
func (s *Server) KeepAlive(stream registryv1.Registry_KeepAliveServer) error {
	ctx := stream.Context()
	release, err := s.openStream(ctx)
	if err != nil {
		return err
	}
	defer release()
	s.m.KeepAliveStreams.Inc()
	defer s.m.KeepAliveStreams.Dec()
	for {
		req, err := stream.Recv()
		if err != nil {
			if ctx.Err() != nil || errors.Is(err, context.Canceled) {
				return nil
			}
			return err // io.EOF included: the client closed its side
		}
		if req.LeaseId <= 0 {
			return invalid("lease_id", "%d is not a lease", req.LeaseId)
		}
		if err := record.ValidService(req.Service); err != nil {
			return toStatus(err)
		}
		if err := record.ValidID(req.Id); err != nil {
			return toStatus(err)
		}
		if req.Secret == "" {
			s.m.NotOwner.WithLabelValues("KeepAlive").Inc()
			return invalid("secret", "is required: the secret Register returned for %s/%s", req.Service, req.Id)
		}
		if err := s.limit(ctx, (*peerlimit.Limiter).KeepAlive); err != nil {
			return err
		}
		cctx, cancel := s.callCtx(ctx)
		ttl, err := s.st.KeepAliveAs(cctx, req.Secret, req.Service, req.Id, req.LeaseId)
		cancel()
		resp := &registryv1.KeepAliveResponse{LeaseId: req.LeaseId, TtlSeconds: int64(ttl / time.Second)}
		switch {
		case errors.Is(err, store.ErrNotOwner):
			s.m.NotOwner.WithLabelValues("KeepAlive").Inc()
			return toStatus(err)
		case errors.Is(err, store.ErrLeaseLost):
			s.m.KeepAliveLost.Inc()
			s.lost(req.Service, req.Id, req.LeaseId)
			resp.Lost, resp.TtlSeconds = true, 0
		case err != nil:
			s.m.KeepAliveFailures.Inc()
			return toStatus(err)
		default:
			s.m.KeepAlives.Inc()
		}
		if err := stream.Send(resp); err != nil {
			return err
		}
	}
}

// Deregister deletes an instance (only while under lease_id, if given) and
// revokes the lease its record is under, never another. With the
// registration's secret it is the owner's graceful end (another secret:
// PermissionDenied); without, an operator's, if Config.Operator allows
// it for this caller (PermissionDenied naming the missing secret if not).
func (s *Server) Deregister(ctx context.Context, req *registryv1.DeregisterRequest) (*registryv1.DeregisterResponse, error) {
	resp, err := s.deregister(ctx, req)
	attrs := []slog.Attr{slog.Bool("owner", req.Secret != "")}
	if err == nil {
		attrs = append(attrs, slog.Bool("deleted", resp.Deleted), slog.Int64("revision", resp.Revision))
	}
	s.audit(ctx, "Deregister", req.Service, req.Id, err, attrs...)
	return resp, err
}

func (s *Server) deregister(ctx context.Context, req *registryv1.DeregisterRequest) (*registryv1.DeregisterResponse, error) {
	if err := s.limit(ctx, (*peerlimit.Limiter).Write); err != nil {
		return nil, err
	}
	done, werr := s.enterWrite(ctx)
	if werr != nil {
		return nil, werr
	}
	defer done()
	if err := record.ValidService(req.Service); err != nil {
		return nil, toStatus(err)
	}
	if err := record.ValidID(req.Id); err != nil {
		return nil, toStatus(err)
	}
	var (
		deleted bool
		rev     int64
		err     error
	)
	cctx, cancel := s.callCtx(ctx)
	defer cancel()
	if req.Secret != "" {
		deleted, rev, err = s.st.DeregisterAs(cctx, req.Secret, req.Service, req.Id, req.LeaseId)
	} else if oerr := s.cfg.Operator(ctx); oerr != nil {
		s.m.NotOwner.WithLabelValues("Deregister").Inc()
		return nil, status.Errorf(codes.PermissionDenied, "deregister %s/%s: secret is required: the one Register returned (%v)", req.Service, req.Id, oerr)
	} else {
		deleted, rev, err = s.st.Deregister(cctx, req.Service, req.Id, req.LeaseId)
	}
	if errors.Is(err, store.ErrNotOwner) {
		s.m.NotOwner.WithLabelValues("Deregister").Inc()
	}
	if err != nil {
		return nil, toStatus(err)
	}
	if !deleted && req.LeaseId == 0 && req.Secret == "" {
		return nil, status.Errorf(codes.NotFound, "%s/%s: %v", req.Service, req.Id, record.ErrNotFound)
	}
	if deleted {
		s.m.Deregistrations.Inc()
		s.ended(req.Service, req.Id, rev)
	}
	return &registryv1.DeregisterResponse{Deleted: deleted, Revision: rev}, nil
}

// Drain marks an instance DRAINING with compare-and-swap. With the
// registration's secret it is the owner's drain (another secret:
// PermissionDenied, nothing written).
func (s *Server) Drain(ctx context.Context, req *registryv1.DrainRequest) (*registryv1.DrainResponse, error) {
	inst, rev, err := s.setLifecycle(ctx, "Drain", req.Secret, req.Service, req.Id, registryv1.Lifecycle_LIFECYCLE_DRAINING, req.Reason)
	if err != nil {
		return nil, err
	}
	return &registryv1.DrainResponse{Instance: inst, Revision: rev}, nil
}

// Undrain marks an instance SERVING with compare-and-swap.
func (s *Server) Undrain(ctx context.Context, req *registryv1.UndrainRequest) (*registryv1.UndrainResponse, error) {
	inst, rev, err := s.setLifecycle(ctx, "Undrain", req.Secret, req.Service, req.Id, registryv1.Lifecycle_LIFECYCLE_SERVING, "")
	if err != nil {
		return nil, err
	}
	return &registryv1.UndrainResponse{Instance: inst, Revision: rev}, nil
}

func (s *Server) setLifecycle(ctx context.Context, method, sec, service, id string, lc registryv1.Lifecycle, reason string) (*registryv1.Instance, int64, error) {
	inst, rev, err := s.writeLifecycle(ctx, sec, service, id, lc, reason)
	attrs := []slog.Attr{slog.String("reason", reason), slog.Bool("owner", sec != "")}
	if err == nil {
		attrs = append(attrs, slog.Int64("revision", rev))
	}
	s.audit(ctx, method, service, id, err, attrs...)
	return inst, rev, err
}

func (s *Server) writeLifecycle(ctx context.Context, sec, service, id string, lc registryv1.Lifecycle, reason string) (*registryv1.Instance, int64, error) {
	if err := s.limit(ctx, (*peerlimit.Limiter).Write); err != nil {
		return nil, 0, err
	}
	done, err := s.enterWrite(ctx)
	if err != nil {
		return nil, 0, err
	}
	defer done()
	cctx, cancel := s.callCtx(ctx)
	defer cancel()
	var (
		inst *registryv1.Instance
		rev  int64
	)
	if sec != "" { // the owner's own drain or undrain
		inst, rev, err = s.st.SetLifecycleAs(cctx, sec, service, id, lc, reason)
	} else {
		inst, rev, err = s.st.SetLifecycle(cctx, service, id, lc, reason)
	}
	if errors.Is(err, store.ErrNotOwner) {
		s.m.NotOwner.WithLabelValues("SetLifecycle").Inc()
	}
	if err != nil {
		return nil, 0, toStatus(err)
	}
	s.m.LifecycleWrites.WithLabelValues(lc.String()).Inc()
	return inst, rev, nil
}

// Get returns one instance and the revision it was read at.
func (s *Server) Get(ctx context.Context, req *registryv1.GetRequest) (*registryv1.GetResponse, error) {
	ctx, cancel := s.callCtx(ctx)
	defer cancel()
	inst, rev, err := s.st.Get(ctx, req.Service, req.Id)
	if err != nil {
		return nil, toStatus(err)
	}
	return &registryv1.GetResponse{Instance: inst, Revision: rev}, nil
}

// Reasons of the errdetails.ErrorInfo (domain ErrorDomain) that come with
// the statuses a client branches on.
const (
	ErrorDomain = "registry.regcluster.io"
	// ReasonRevisionAhead (code OutOfRange, from Watch): the subscriber
	// has seen a revision or epoch this regnode has not reached within its
	// catch-up timeout. Try another regnode; when none has it, subscribe
	// afresh.
	ReasonRevisionAhead = "REVISION_AHEAD"
	// ReasonPageTokenExpired (code Aborted, from List): the listing's
	// revision was compacted or etcd was restored; list again from the
	// first page.
	ReasonPageTokenExpired = "PAGE_TOKEN_EXPIRED"
)

// List page sizes: the default when page_size is 0, and the most a page
// holds (a larger page_size is read as this). A page is also bounded by
// bytes (chunk.MaxBytes of instances).
const (
	DefaultPageSize = 500
	MaxPageSize     = 1000
)

// withReason is a status of code c carrying an ErrorInfo of reason.
func withReason(c codes.Code, reason, msg string, meta map[string]string) error {
	st := status.New(c, msg)
	if d, err := st.WithDetails(&errdetails.ErrorInfo{Reason: reason, Domain: ErrorDomain, Metadata: meta}); err == nil {
		st = d
	}
	return st.Err()
}

// Reason is the ErrorInfo reason of a status from this server ("" if none).
func Reason(err error) string {
	for _, d := range status.Convert(err).Details() {
		if info, ok := d.(*errdetails.ErrorInfo); ok && info.Domain == ErrorDomain {
			return info.Reason
		}
	}
	return ""
}

// List returns one page of the instances of a service (all if empty):
// every page of a listing is read at the revision of its first page,
// which it returns, and holds at most page_size instances and about
// chunk.MaxBytes of them.
func (s *Server) List(ctx context.Context, req *registryv1.ListRequest) (*registryv1.ListResponse, error) {
	limit := int64(req.PageSize)
	switch {
	case limit < 0:
		return nil, invalid("page_size", "%d is negative", limit)
	case limit == 0:
		limit = DefaultPageSize
	case limit > MaxPageSize:
		limit = MaxPageSize
	}
	var cur store.Cursor
	if req.PageToken != "" {
		var err error
		if cur, err = decodePageToken(req.PageToken, req.Service); err != nil {
			return nil, toStatus(err)
		}
	}
	ctx, cancel := s.callCtx(ctx)
	defer cancel()
	page, err := s.st.ListPage(ctx, req.Service, cur, limit, chunk.MaxBytes)
	if errors.Is(err, store.ErrPageExpired) {
		return nil, withReason(codes.Aborted, ReasonPageTokenExpired, err.Error(),
			map[string]string{"revision": strconv.FormatInt(cur.Revision, 10)})
	}
	if err != nil {
		return nil, toStatus(err)
	}
	resp := &registryv1.ListResponse{Instances: page.Instances, Revision: page.Revision, Skipped: int64(page.Skipped), Epoch: page.Epoch}
	if page.Next != nil {
		resp.NextPageToken = encodePageToken(*page.Next, req.Service)
	}
	return resp, nil
}

// Watch serves a subscription from this regnode's fan-out (no etcd watch
// per subscriber): a snapshot or the missed transactions, then every
// transaction and progress, each with its revision and epoch; no message
// exceeds chunk.MaxBytes (see package chunk). A subscriber ahead of this
// regnode gets OutOfRange with reason ReasonRevisionAhead. Every message
// goes out as bytes the hub encoded once for all the subscribers of the
// service: the server must run with DecodeOptions' codec.
//
// The stream is a live subscriber for WaitApplied for as long as it runs,
// one that cannot acknowledge: it counts by the highest revision handed
// to its transport (an atomic of its own, stored after each unit; see
// subscribers.sent). A client that stopped reading is counted as sent
// what fits its HTTP/2 flow-control window and the transport's write
// quota; past that the sends block, so it holds a drain's wait and is
// named.
func (s *Server) Watch(req *registryv1.WatchRequest, stream registryv1.Registry_WatchServer) error {
	if s.cfg.Hub == nil {
		return status.Error(codes.Unimplemented, "this regnode serves no subscriptions")
	}
	ctx := stream.Context()
	release, err := s.openStream(ctx)
	if err != nil {
		return err
	}
	defer release()
	sub, err := s.cfg.Hub.Subscribe(ctx, req.Service, req.FromRevision, req.Epoch)
	if err != nil {
		switch {
		case errors.Is(err, fanout.ErrBehind):
			return withReason(codes.OutOfRange, ReasonRevisionAhead, err.Error(), map[string]string{
				"from_revision": strconv.FormatInt(req.FromRevision, 10), "epoch": req.Epoch})
		case errors.Is(err, fanout.ErrClosed):
			return status.Error(codes.Unavailable, err.Error())
		}
		return toStatus(err)
	}
	defer sub.Close()
	ws := s.subs.addWatch(req.Service, req.Subscriber, peerAddr(ctx), req.FromRevision)
	defer s.subs.removeWatch(ws)
	for {
		u, err := sub.Next(ctx)
		if err != nil {
			if errors.Is(err, fanout.ErrClosed) {
				return status.Error(codes.Unavailable, "regnode is stopping; resume on another")
			}
			return toStatus(err)
		}
		if err := sendUnit(stream, u); err != nil {
			return err
		}
		s.subs.sent(ws, u.Revision())
	}
}

// sendUnit sends the unit's chunks, encoded once by the hub for every
// subscriber it goes to, as they are (see Encoded).
func sendUnit(stream grpc.ServerStream, u *fanout.Unit) error {
	chunks, err := u.Chunks()
	if err != nil {
		return status.Errorf(codes.Internal, "encode the unit at revision %d: %v", u.Revision(), err)
	}
	for _, c := range chunks {
		if err := stream.SendMsg(Encoded(c)); err != nil {
			return err
		}
	}
	return nil
}

// Status reports the etcd cluster (members, leader, revision, compact
// revision) and instance counts, at a revision no older than etcd's when
// the call came (see countInstances).
func (s *Server) Status(ctx context.Context, req *registryv1.StatusRequest) (*registryv1.StatusResponse, error) {
	ctx, cancel := s.callCtx(ctx)
	defer cancel()
	cli := s.st.Client()
	ml, err := cli.MemberList(ctx)
	if err != nil {
		return nil, toStatus(fmt.Errorf("list etcd members: %w", err))
	}
	resp := &registryv1.StatusResponse{Node: s.cfg.Node, Embedded: s.cfg.Embedded, Version: s.cfg.Version,
		ClusterId: ml.Header.ClusterId}
	var etcdLeader uint64
	for _, ep := range cli.Endpoints() {
		st, err := cli.Status(ctx, ep)
		if err != nil {
			continue
		}
		etcdLeader, resp.EtcdVersion = st.Leader, st.Version
		break
	}
	for _, m := range ml.Members {
		resp.Members = append(resp.Members, &registryv1.Member{Id: m.ID, Name: m.Name, PeerUrls: m.PeerURLs,
			ClientUrls: m.ClientURLs, IsLeader: m.ID == etcdLeader, IsLearner: m.IsLearner})
	}
	if resp.CompactRevision, err = s.st.CompactRevision(ctx); err != nil {
		return nil, toStatus(err)
	}
	if resp.Counts, resp.Revision, resp.JunkSkipped, err = s.countInstances(ctx); err != nil {
		return nil, toStatus(err)
	}
	if resp.Epoch, _, err = epoch.Read(ctx, cli, epoch.Key(s.st.Keys().Prefix())); err != nil {
		return nil, toStatus(err)
	}
	if s.cfg.Leader != nil {
		resp.Leader = s.cfg.Leader(ctx)
	}
	resp.Probing, resp.Regnodes = s.probing(ctx, req.GetPeers())
	return resp, nil
}

// statusCatchUp bounds how long Status waits for the hub to reach etcd's
// revision before it lists etcd instead.
const statusCatchUp = 2 * time.Second

// countInstances counts the instances by state, at a revision no older
// than etcd's when it is called, and the junk records beside them. With a
// hub it reads no record: one count-only range read gives etcd's revision
// and how many keys the instances prefix holds; the hub's cache, once at
// that revision (waited for up to statusCatchUp), holds the valid ones;
// the difference is junk (at the cache's revision, read again if the
// cache has moved past etcd's first answer). Without a hub, or with one
// that does not catch up in time, it lists the prefix from etcd.
func (s *Server) countInstances(ctx context.Context) (*registryv1.InstanceCounts, int64, int64, error) {
	if hub := s.cfg.Hub; hub != nil {
		cli, prefix := s.st.Client(), s.st.Keys().Instances()
		keys, err := cli.Get(ctx, prefix, clientv3.WithPrefix(), clientv3.WithCountOnly())
		if err != nil {
			return nil, 0, 0, fmt.Errorf("count the keys under %s: %w", prefix, err)
		}
		wctx, cancel := context.WithTimeout(ctx, statusCatchUp)
		snap, _, werr := hub.WaitRevision(wctx, keys.Header.Revision)
		cancel()
		if werr == nil && snap.Revision() > keys.Header.Revision {
			keys, err = cli.Get(ctx, prefix, clientv3.WithPrefix(), clientv3.WithCountOnly(), clientv3.WithRev(snap.Revision()))
			if err != nil {
				return nil, 0, 0, fmt.Errorf("count the keys under %s at revision %d: %w", prefix, snap.Revision(), err)
			}
		}
		if werr == nil {
			return CountSnapshot(snap), snap.Revision(), keys.Count - int64(snap.Len()), nil
		}
		s.log.Warn("the hub is behind etcd: Status lists etcd", "err", werr)
	}
	insts, rev, skipped, err := s.st.List(ctx, "")
	if err != nil {
		return nil, 0, 0, err
	}
	return Count(insts), rev, int64(skipped), nil
}

// CountSnapshot tallies the instances of a cache snapshot, as Count does,
// without copying them.
func CountSnapshot(snap *cache.Snapshot) *registryv1.InstanceCounts {
	services := snap.Services()
	c := &registryv1.InstanceCounts{Services: int64(len(services))}
	for _, svc := range services {
		tally(c, snap.Each(svc)) // the cache's tree: no flat copy built
	}
	return c
}

// Count tallies instances by lifecycle and health.
func Count(insts []*registryv1.Instance) *registryv1.InstanceCounts {
	c := &registryv1.InstanceCounts{}
	services := map[string]struct{}{}
	for _, in := range insts {
		services[in.Service] = struct{}{}
	}
	tally(c, slices.Values(insts))
	c.Services = int64(len(services))
	return c
}

// tally adds insts to c's totals by lifecycle and health.
func tally(c *registryv1.InstanceCounts, insts iter.Seq[*registryv1.Instance]) {
	for in := range insts {
		c.Total++
		switch in.Lifecycle {
		case registryv1.Lifecycle_LIFECYCLE_STARTING:
			c.Starting++
		case registryv1.Lifecycle_LIFECYCLE_DRAINING:
			c.Draining++
		default:
			c.Serving++
		}
		switch in.GetHealth().GetState() {
		case registryv1.HealthState_HEALTH_STATE_HEALTHY:
			c.Healthy++
		case registryv1.HealthState_HEALTH_STATE_DEGRADED:
			c.Degraded++
		case registryv1.HealthState_HEALTH_STATE_UNAVAILABLE:
			c.Unavailable++
		default:
			c.Unknown++
		}
	}
}
