package server

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"strings"
	"sync"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	clientv3 "go.etcd.io/etcd/client/v3"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/credentials"
	"google.golang.org/grpc/metadata"
	"google.golang.org/grpc/peer"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/types/known/timestamppb"

	"github.com/regcluster/registry/internal/configerr"
	"github.com/regcluster/registry/internal/metrics"
	"github.com/regcluster/registry/internal/peerlimit"
	"github.com/regcluster/registry/internal/token"
	registryv1 "github.com/regcluster/registry/proto/registry/v1"
	"github.com/regcluster/registry/record"
)

// Auth is the scoped-token check of every registry.v1 call (regnode
// --auth), as gRPC interceptors. A call carries its token in metadata
// "authorization: Bearer <token>"; it is authenticated when the call (or
// stream) starts, and each request message is authorized against the
// service it names before the handler sees it, so a refused call reaches
// no handler and writes nothing. Other services on the same server (gRPC
// health, reflection) are not checked: they say nothing about the
// registry's contents.
type Auth struct {
	cache   *token.Cache
	log     *slog.Logger
	refused *prometheus.CounterVec

	peerMu     sync.Mutex
	peerSecret string // AllowPeers
}

// NewAuth returns the check of cache, counting refusals on m
// (registry_auth_refused_total by method and code).
func NewAuth(cache *token.Cache, m *metrics.Metrics, log *slog.Logger) (*Auth, error) {
	if cache == nil || m == nil {
		return nil, errors.New("server: NewAuth needs a token cache and metrics")
	}
	if log == nil {
		log = slog.Default()
	}
	a := &Auth{cache: cache, log: log, refused: prometheus.NewCounterVec(prometheus.CounterOpts{
		Name: "registry_auth_refused_total",
		Help: "Calls refused by the token check, by method and gRPC code (Unauthenticated, PermissionDenied, InvalidArgument).",
	}, []string{"method", "code"})}
	if err := m.Registry.Register(a.refused); err != nil {
		return nil, fmt.Errorf("register the auth metrics: %w", err)
	}
	return a, nil
}

// registryMethod is the short name of a registry.v1 method, or "" for a
// method of another service (not checked).
func registryMethod(full string) string {
	for _, svc := range []string{registryv1.Registry_ServiceDesc.ServiceName, registryv1.Tokens_ServiceDesc.ServiceName} {
		if m, ok := strings.CutPrefix(full, "/"+svc+"/"); ok {
			return m
		}
	}
	return ""
}

// requirement is what a request asks for: the method as the token check
// knows it, and the service it is about ("" for every service). A method
// that names one instance must name its service: InvalidArgument if not.
func requirement(method string, req any) (token.Method, string, error) {
	one := func(m token.Method, service string) (token.Method, string, error) {
		if service == "" {
			return "", "", toStatus(&record.FieldError{Field: "service", Reason: "must not be empty"})
		}
		return m, service, nil
	}
	switch r := req.(type) {
	case *registryv1.GetRequest:
		return one(token.Get, r.Service)
	case *registryv1.ListRequest:
		return token.List, r.Service, nil
	case *registryv1.WatchRequest:
		return token.Watch, r.Service, nil
	case *registryv1.StatusRequest:
		return token.Status, "", nil
	case *registryv1.RegisterRequest:
		return one(token.RegisterCall, r.GetInstance().GetService())
	case *registryv1.KeepAliveRequest:
		return one(token.KeepAlive, r.Service)
	case *registryv1.DeregisterRequest:
		if r.Secret != "" {
			return one(token.DeregisterOwn, r.Service)
		}
		return one(token.Deregister, r.Service)
	case *registryv1.DrainRequest:
		if r.Secret != "" {
			return one(token.DrainOwn, r.Service)
		}
		return one(token.Drain, r.Service)
	case *registryv1.UndrainRequest:
		if r.Secret != "" {
			return one(token.UndrainOwn, r.Service)
		}
		return one(token.Undrain, r.Service)
	case *registryv1.SubscribeRequest:
		// Each message of the stream: adding, removing or acknowledging a
		// service is following it (read on it; "" is every service); a
		// message that only names the subscriber needs read on any scope.
		switch k := r.Kind.(type) {
		case *registryv1.SubscribeRequest_Add:
			return token.Watch, k.Add.GetService(), nil
		case *registryv1.SubscribeRequest_Remove:
			return token.Watch, k.Remove.GetService(), nil
		case *registryv1.SubscribeRequest_Ack:
			return token.Watch, k.Ack.GetService(), nil
		case *registryv1.SubscribeRequest_Report:
			// Reporting calls to a service's instances: read on it.
			return token.Watch, k.Report.GetService(), nil
		}
		return token.Status, "", nil
	case *registryv1.WaitAppliedRequest:
		// Who follows a service, and how far: read on it.
		return one(token.Get, r.Service)
	case *registryv1.ConfirmProbeRequest:
		// Another regnode's, with the peer secret; otherwise a probe of
		// one instance's health: read on it.
		return one(token.Get, r.Service)
	case *registryv1.XdsClientsRequest:
		// Who follows every service: read on every service, as an xDS
		// stream needs.
		return token.Watch, "", nil
	case *registryv1.CreateTokenRequest:
		return token.CreateToken, "", nil
	case *registryv1.ListTokensRequest:
		return token.ListTokens, "", nil
	case *registryv1.RevokeTokenRequest:
		return token.RevokeToken, "", nil
	}
	// A method this table does not know is refused: a new RPC must say
	// who may call it before tokens let anyone.
	return token.Method(method), "", nil
}

// authenticate is the record of the call's token, or the status
// refusing it.
func (a *Auth) authenticate(ctx context.Context, method string) (*token.Record, error) {
	tok, err := token.FromIncoming(ctx)
	if err != nil {
		return nil, a.refuse(ctx, method, status.Errorf(codes.Unauthenticated, "authorization metadata: %v", err))
	}
	r, err := a.cache.Authenticate(tok)
	if err != nil {
		return nil, a.refuse(ctx, method, err)
	}
	return r, nil
}

// authorize checks one request message of a call made with r.
func (a *Auth) authorize(ctx context.Context, r *token.Record, method string, req any) error {
	m, service, err := requirement(method, req)
	if err == nil {
		err = a.cache.Authorize(r, m, service)
	}
	if err != nil {
		return a.refuse(ctx, method, err)
	}
	return nil
}

// refuse counts and logs (at debug: a stranger's scan must not flood the
// log) a refusal; the message never holds the token.
func (a *Auth) refuse(ctx context.Context, method string, err error) error {
	code := status.Code(err)
	a.refused.WithLabelValues(method, code.String()).Inc()
	a.log.LogAttrs(ctx, slog.LevelDebug, "call refused by the token check", slog.String("peer", peerlimit.Peer(ctx)),
		slog.String("method", method), slog.String("code", code.String()), slog.String("error", status.Convert(err).Message()))
	return err
}

// Unary is the check of unary registry.v1 calls.
func (a *Auth) Unary() grpc.UnaryServerInterceptor {
	return func(ctx context.Context, req any, info *grpc.UnaryServerInfo, handler grpc.UnaryHandler) (any, error) {
		method := registryMethod(info.FullMethod)
		if method == "" {
			return handler(ctx, req)
		}
		switch req.(type) {
		case *registryv1.ConfirmProbeRequest, *registryv1.ForwardReportsRequest:
			if a.fromPeer(ctx) {
				return handler(ctx, req) // another regnode (AllowPeers)
			}
		}
		r, err := a.authenticate(ctx, method)
		if err != nil {
			return nil, err
		}
		if err := a.authorize(ctx, r, method, req); err != nil {
			return nil, err
		}
		return handler(token.WithRecord(ctx, r), req)
	}
}

// errTokenGone ends a stream whose token was revoked or expired.
var errTokenGone = errors.New("token revoked or expired")

// Stream is the check of streaming registry.v1 calls: the token when the
// stream opens, and every request message (each KeepAlive request names
// its own instance) before the handler receives it. A stream whose token
// is revoked or expires while it is open ends with Unauthenticated: a
// Watch at once, a KeepAlive at its next request (its context is gone).
func (a *Auth) Stream() grpc.StreamServerInterceptor {
	return func(srv any, ss grpc.ServerStream, info *grpc.StreamServerInfo, handler grpc.StreamHandler) error {
		method := registryMethod(info.FullMethod)
		xds := strings.HasPrefix(info.FullMethod, xdsService)
		if xds {
			method = "xDS"
		}
		if method == "" {
			return handler(srv, ss)
		}
		var r *token.Record
		var err error
		if cn := certName(ss.Context()); xds && cn != "" && !hasToken(ss.Context()) {
			// An xDS client may be identified by its verified client
			// certificate: gRPC bootstraps carry no token in most
			// languages. It gets the scope of the token named like the
			// certificate's common name.
			if r, err = a.cache.ByName(cn); err != nil {
				return a.refuse(ss.Context(), method, err)
			}
		} else if r, err = a.authenticate(ss.Context(), method); err != nil {
			return err
		}
		ctx, cancel := context.WithCancelCause(token.WithRecord(ss.Context(), r))
		defer cancel(nil)
		var expiry <-chan time.Time
		if !r.Expires.IsZero() {
			t := time.NewTimer(time.Until(r.Expires))
			defer t.Stop()
			expiry = t.C
		}
		gone, done := a.cache.Gone(r), make(chan struct{})
		go func() { // owned by this call: ends with ctx, waited for below
			defer close(done)
			select {
			case <-gone:
				cancel(errTokenGone)
			case <-expiry:
				cancel(errTokenGone)
			case <-ctx.Done():
			}
		}()
		if xds {
			// Any token may open it; what it is served is what its scope
			// may read (CanRead, package xds's Config.Scope).
			err = handler(srv, &ctxStream{ServerStream: ss, ctx: ctx})
		} else {
			err = handler(srv, &authStream{ServerStream: ss, a: a, r: r, method: method, ctx: ctx})
		}
		cancel(nil)
		<-done
		if errors.Is(context.Cause(ctx), errTokenGone) {
			return a.refuse(ctx, method, status.Errorf(codes.Unauthenticated, "token %s was revoked or expired while the stream was open", r.Name))
		}
		return err
	}
}

// certName is the common name of the caller's client certificate when
// the TLS handshake verified it (--client-cert-auth), else "".
func certName(ctx context.Context) string {
	p, ok := peer.FromContext(ctx)
	if !ok {
		return ""
	}
	ti, ok := p.AuthInfo.(credentials.TLSInfo)
	if !ok || len(ti.State.VerifiedChains) == 0 || len(ti.State.VerifiedChains[0]) == 0 {
		return ""
	}
	return ti.State.VerifiedChains[0][0].Subject.CommonName
}

// hasToken reports whether the call carries authorization metadata.
func hasToken(ctx context.Context) bool {
	md, _ := metadata.FromIncomingContext(ctx)
	return len(md.Get("authorization")) > 0
}

// ctxStream is a stream with the context of its token check.
type ctxStream struct {
	grpc.ServerStream
	ctx context.Context
}

func (s *ctxStream) Context() context.Context { return s.ctx }

// CanRead reports whether the token of ctx (a call or stream this Auth
// checked) may read service ("": every service). An xDS stream is served
// only what its token may read.
func (a *Auth) CanRead(ctx context.Context, service string) bool {
	r, ok := token.FromContext(ctx)
	return ok && a.cache.Authorize(r, token.Watch, service) == nil
}

// xdsService is the prefix of the xDS streams' methods (package xds).
const xdsService = "/envoy.service.discovery.v3.AggregatedDiscoveryService/"

// LimitXDS caps each caller's xDS streams (package xds, served beside
// this API) with the same per-caller stream budget as Watch, Subscribe
// and KeepAlive streams (peerlimit MaxStreams, by peer, or by token with
// --auth): a stranger cannot hold more of them than of any other stream.
func (s *Server) LimitXDS() grpc.StreamServerInterceptor {
	return func(srv any, ss grpc.ServerStream, info *grpc.StreamServerInfo, handler grpc.StreamHandler) error {
		if !strings.HasPrefix(info.FullMethod, xdsService) {
			return handler(srv, ss)
		}
		release, err := s.openStream(ss.Context())
		if err != nil {
			return err
		}
		defer release()
		return handler(srv, ss)
	}
}

type authStream struct {
	grpc.ServerStream
	a      *Auth
	r      *token.Record
	method string
	ctx    context.Context
}

func (s *authStream) Context() context.Context { return s.ctx }

// RecvMsg authorizes each message with the stream's token. A revoke or
// expiry needs no check here: it cancels the stream's context (Stream),
// which ends the handler's etcd calls and the stream with it.
//
// A Subscribe stream's add of a service the token may not read is
// refused as that service's own error (ServiceRefused), which the
// handler answers and goes on: one service out of scope must not end the
// stream that carries the client's others.
func (s *authStream) RecvMsg(m any) error {
	if err := s.ServerStream.RecvMsg(m); err != nil {
		return err
	}
	err := s.a.authorize(s.ctx, s.r, s.method, m)
	if req, ok := m.(*registryv1.SubscribeRequest); ok && err != nil && req.GetAdd() != nil {
		return &ServiceRefused{Service: req.GetAdd().GetService(), Err: err}
	}
	return err
}

// ServiceRefused is the error a Subscribe stream's receive returns for an
// add the token check refused: the stream goes on, and the service ends
// with Err (its status) as its SubscribeError.
type ServiceRefused struct {
	Service string
	Err     error
}

func (e *ServiceRefused) Error() string { return fmt.Sprintf("follow %q: %v", e.Service, e.Err) }

// Unwrap is the refusal's status error.
func (e *ServiceRefused) Unwrap() error { return e.Err }

// TokenLimitKey keys the per-caller limits by token name when a call
// carries one (each token its own buckets), by peer address otherwise.
func TokenLimitKey(ctx context.Context) string {
	if r, ok := token.FromContext(ctx); ok {
		return "token " + r.Name
	}
	return peerlimit.Peer(ctx)
}

// TokenOperator allows an operator's Deregister (without the
// registration's secret) to a call made with an operate or admin token.
// The token check has already matched the scope to the service.
func TokenOperator(ctx context.Context) error {
	r, ok := token.FromContext(ctx)
	if ok && (r.Role == token.Operate || r.Role == token.Admin) {
		return nil
	}
	return errors.New("deregistering another's instance needs an operate token")
}

// TokensConfig configures the Tokens service. A zero field takes the
// default its comment states (DefaultTokensConfig has them all).
type TokensConfig struct {
	// Cache is what ListTokens reads (required).
	Cache *token.Cache
	// Client is where tokens are written (required).
	Client *clientv3.Client
	// Prefix is the registry's key prefix ("": record.DefaultPrefix).
	Prefix string
	// Metrics receives the token-change counter (required).
	Metrics *metrics.Metrics
	// Logger receives the audit lines (nil: slog.Default()).
	Logger *slog.Logger
	// CallTimeout bounds each etcd call (0: 5s, as Config.CallTimeout);
	// it must not be negative.
	CallTimeout time.Duration
}

// DefaultTokensConfig is a TokensConfig with every default but the
// required fields.
func DefaultTokensConfig() TokensConfig {
	return TokensConfig{Prefix: record.DefaultPrefix, CallTimeout: DefaultConfig().CallTimeout}
}

// withDefaults is c with its zero fields set to DefaultTokensConfig's.
func (c TokensConfig) withDefaults() TokensConfig {
	d := DefaultTokensConfig()
	if c.Prefix == "" {
		c.Prefix = d.Prefix
	}
	if c.Logger == nil {
		c.Logger = slog.Default()
	}
	if c.CallTimeout == 0 {
		c.CallTimeout = d.CallTimeout
	}
	return c
}

// Validate reports the first field that cannot work, with its defaults
// filled, as a *configerr.Error wrapping ErrInvalidConfig.
func (c TokensConfig) Validate() error {
	c = c.withDefaults()
	var err *configerr.Error
	switch {
	case c.Cache == nil:
		err = configerr.Required(ErrInvalidConfig, "server", "Cache")
	case c.Client == nil:
		err = configerr.Required(ErrInvalidConfig, "server", "Client")
	case c.Metrics == nil:
		err = configerr.Required(ErrInvalidConfig, "server", "Metrics")
	case c.CallTimeout < 0:
		err = configerr.New(ErrInvalidConfig, "server", "CallTimeout", c.CallTimeout, "must be >= 0 (0: the default)")
	default:
		return nil
	}
	return err.Of("TokensConfig")
}

// Tokens is the registry.v1.Tokens service: create, list and revoke
// tokens (admin of scope all, checked by Auth). Each create and revoke is
// one audit line and counted (registry_token_changes_total).
type Tokens struct {
	registryv1.UnimplementedTokensServer
	cfg     TokensConfig
	changes *prometheus.CounterVec
}

// NewTokens returns the Tokens service of cfg; it fails if cfg does not
// Validate or its metric cannot be registered.
func NewTokens(cfg TokensConfig) (*Tokens, error) {
	if err := cfg.Validate(); err != nil {
		return nil, err
	}
	cfg = cfg.withDefaults()
	t := &Tokens{cfg: cfg, changes: prometheus.NewCounterVec(prometheus.CounterOpts{
		Name: "registry_token_changes_total",
		Help: "Token creates and revokes, by operation and result (ok or the gRPC code).",
	}, []string{"op", "result"})}
	if err := cfg.Metrics.Registry.Register(t.changes); err != nil {
		return nil, fmt.Errorf("register the token metrics: %w", err)
	}
	return t, nil
}

func (t *Tokens) audit(ctx context.Context, op, target string, err error, attrs ...slog.Attr) {
	result := "ok"
	if err != nil {
		result = status.Code(err).String()
		attrs = append(attrs, slog.String("error", status.Convert(err).Message()))
	}
	t.changes.WithLabelValues(op, result).Inc()
	by := ""
	if r, ok := token.FromContext(ctx); ok {
		by = r.Name
	}
	t.cfg.Logger.LogAttrs(ctx, slog.LevelInfo, "audit", append([]slog.Attr{slog.String("peer", peerlimit.Peer(ctx)),
		slog.String("token", by), slog.String("method", op), slog.String("target", "token/"+target),
		slog.String("result", result)}, attrs...)...)
}

func scopeOf(s *registryv1.TokenScope) (token.Scope, error) {
	if s == nil {
		return token.Scope{}, &record.FieldError{Field: "scope", Reason: "must be set"}
	}
	switch s.Kind {
	case registryv1.TokenScope_KIND_SERVICE:
		return token.Scope{Kind: token.ScopeService, Value: s.Value}, nil
	case registryv1.TokenScope_KIND_PREFIX:
		return token.Scope{Kind: token.ScopePrefix, Value: s.Value}, nil
	case registryv1.TokenScope_KIND_ALL:
		return token.Scope{Kind: token.ScopeAll, Value: s.Value}, nil
	}
	return token.Scope{}, &record.FieldError{Field: "scope.kind", Reason: fmt.Sprintf("%s: must be service, prefix or all", s.Kind)}
}

var roles = map[registryv1.TokenRole]token.Role{
	registryv1.TokenRole_TOKEN_ROLE_READ: token.Read, registryv1.TokenRole_TOKEN_ROLE_REGISTER: token.Register,
	registryv1.TokenRole_TOKEN_ROLE_OPERATE: token.Operate, registryv1.TokenRole_TOKEN_ROLE_ADMIN: token.Admin,
}

// Info is the API's form of a token (never its secret).
func Info(e token.Entry) *registryv1.TokenInfo {
	ti := &registryv1.TokenInfo{Name: e.Name, Created: timestamppb.New(e.Created), CreatedBy: e.CreatedBy,
		Scope: &registryv1.TokenScope{Value: e.Scope.Value}}
	for k, v := range roles {
		if v == e.Role {
			ti.Role = k
		}
	}
	switch e.Scope.Kind {
	case token.ScopeService:
		ti.Scope.Kind = registryv1.TokenScope_KIND_SERVICE
	case token.ScopePrefix:
		ti.Scope.Kind = registryv1.TokenScope_KIND_PREFIX
	case token.ScopeAll:
		ti.Scope.Kind = registryv1.TokenScope_KIND_ALL
	}
	if !e.Expires.IsZero() {
		ti.Expires = timestamppb.New(e.Expires)
	}
	if !e.LastUsed.IsZero() {
		ti.LastUsed = timestamppb.New(e.LastUsed)
	}
	return ti
}

// CreateToken stores a new token and returns its secret, once.
func (t *Tokens) CreateToken(ctx context.Context, req *registryv1.CreateTokenRequest) (*registryv1.CreateTokenResponse, error) {
	resp, err := t.create(ctx, req)
	attrs := []slog.Attr{slog.String("role", req.Role.String())}
	if err == nil {
		attrs = append(attrs, slog.String("scope", resp.Token.Scope.Kind.String()+":"+resp.Token.Scope.Value))
	}
	t.audit(ctx, "CreateToken", req.Name, err, attrs...)
	return resp, err
}

func (t *Tokens) create(ctx context.Context, req *registryv1.CreateTokenRequest) (*registryv1.CreateTokenResponse, error) {
	if err := token.ValidName(req.Name); err != nil {
		return nil, toStatus(err)
	}
	role, ok := roles[req.Role]
	if !ok {
		return nil, invalid("role", "%s: must be read, register, operate or admin", req.Role)
	}
	scope, err := scopeOf(req.Scope)
	if err != nil {
		return nil, toStatus(err)
	}
	if err := scope.Validate(); err != nil {
		return nil, toStatus(err)
	}
	var ttl time.Duration
	if req.Ttl != nil {
		if err := req.Ttl.CheckValid(); err != nil {
			return nil, invalid("ttl", "%v", err)
		}
		if ttl = req.Ttl.AsDuration(); ttl <= 0 {
			return nil, invalid("ttl", "%s must be positive (omit it for a token that never expires)", ttl)
		}
	}
	by := ""
	if r, ok := token.FromContext(ctx); ok {
		by = r.Name
	}
	cctx, cancel := context.WithTimeout(ctx, t.cfg.CallTimeout)
	defer cancel()
	rec, secret, rev, err := token.Create(cctx, t.cfg.Client, t.cfg.Prefix, req.Name, role, scope, ttl, by)
	switch {
	case errors.Is(err, token.ErrExists):
		return nil, status.Error(codes.AlreadyExists, err.Error())
	case err != nil:
		return nil, toStatus(err)
	}
	// Usable here as soon as the caller has it (other regnodes follow
	// within their watch's delay).
	if err := t.cfg.Cache.WaitRevision(cctx, rev); err != nil {
		return nil, toStatus(err)
	}
	return &registryv1.CreateTokenResponse{Token: Info(token.Entry{Record: *rec}), Secret: secret}, nil
}

// ListTokens lists every token (last use as this regnode saw it).
func (t *Tokens) ListTokens(context.Context, *registryv1.ListTokensRequest) (*registryv1.ListTokensResponse, error) {
	var resp registryv1.ListTokensResponse
	for _, e := range t.cfg.Cache.List() {
		resp.Tokens = append(resp.Tokens, Info(e))
	}
	return &resp, nil
}

// RevokeToken deletes a token; every regnode refuses it once the delete
// reaches its cache's watch.
func (t *Tokens) RevokeToken(ctx context.Context, req *registryv1.RevokeTokenRequest) (*registryv1.RevokeTokenResponse, error) {
	resp, err := t.revoke(ctx, req)
	t.audit(ctx, "RevokeToken", req.Name, err)
	return resp, err
}

func (t *Tokens) revoke(ctx context.Context, req *registryv1.RevokeTokenRequest) (*registryv1.RevokeTokenResponse, error) {
	if err := token.ValidName(req.Name); err != nil {
		return nil, toStatus(err)
	}
	cctx, cancel := context.WithTimeout(ctx, t.cfg.CallTimeout)
	defer cancel()
	rev, err := token.Revoke(cctx, t.cfg.Client, t.cfg.Prefix, req.Name)
	switch {
	case errors.Is(err, token.ErrNotFound):
		return nil, status.Error(codes.NotFound, err.Error())
	case err != nil:
		return nil, toStatus(err)
	}
	// Refused here, and its streams here ended, before the caller hears
	// it is done.
	if err := t.cfg.Cache.WaitRevision(cctx, rev); err != nil {
		return nil, toStatus(err)
	}
	return &registryv1.RevokeTokenResponse{Revision: rev}, nil
}
