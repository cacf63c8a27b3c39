// Package httpapi is the registry's HTTP/JSON read API, for curl and any
// language: services, list, get, status, and watch as Server-Sent Events,
// plus drain and undrain. Every route is one call of the gRPC service
// registry.v1.Registry through a client connection, so the HTTP API has no
// registry logic of its own: validation, reads at one revision and the
// fan-out behind watch are the gRPC server's.
//
// The JSON is the CLI's contract, not protobuf's: responses are encoded
// with internal/render, the same types `regctl -o json` prints (snake_case
// names, enums without their prefix, lease ids in hex, health latency in
// milliseconds). protojson, which grpc-gateway uses, would print
// "LIFECYCLE_SERVING", decimal-string lease ids and "0.003s" latencies, so
// a script written against regctl would not work against the HTTP API.
// gRPC status codes become HTTP statuses with grpc-gateway's own table
// (runtime.HTTPStatusFromCode), the mapping every grpc-gateway user gets.
//
// Routes (all JSON; errors are {"error": MESSAGE, "code": GRPC_CODE,
// "field": FIELD} with field set when one input is at fault):
//
//	GET  /api/v1/services                              regctl services -o json
//	GET  /api/v1/instances                             regctl list -o json
//	GET  /api/v1/services/{service}/instances          regctl list SERVICE -o json
//	GET  /api/v1/services/{service}/instances/{id}     regctl get SERVICE/ID -o json
//	GET  /api/v1/status                                regctl status -o json
//	GET  /api/v1/watch[?service=S][&from_revision=R]   regctl watch -o json, as SSE
//	POST /api/v1/services/{service}/instances/{id}/drain    body {"reason": R} (optional)
//	POST /api/v1/services/{service}/instances/{id}/undrain
//	POST   /api/v1/services/{service}/instances            register (register.go)
//	POST   /api/v1/services/{service}/instances/{id}/keepalive
//	DELETE /api/v1/services/{service}/instances/{id}
//	GET  /api/v1/prometheus/targets[?service=S][&metrics_port=P]
//	                                                   Prometheus http_sd_configs (prometheus.go)
//
// With Config.ReadOnly drain and undrain answer 403 and write nothing;
// registration follows the gRPC API's rules (register.go).
package httpapi

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net/http"
	"strconv"
	"strings"
	"time"

	"github.com/grpc-ecosystem/grpc-gateway/v2/runtime"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/metadata"
	"google.golang.org/grpc/status"

	"github.com/regcluster/registry/internal/configerr"
	"github.com/regcluster/registry/internal/render"
	registryv1 "github.com/regcluster/registry/proto/registry/v1"
	"github.com/regcluster/registry/record"
)

// Prefix is where the API's routes live.
const Prefix = "/api/v1/"

// maxBody bounds a POST body: a drain reason, not a record.
const maxBody = 16 << 10

// Config configures the API.
type Config struct {
	// Conn is a connection to a regnode's gRPC API (required). Calls go
	// through it, so they pass the regnode's interceptors like any other.
	Conn grpc.ClientConnInterface
	// ReadOnly refuses drain and undrain with 403 Forbidden (and, without
	// Caller, an operator's deregistration).
	ReadOnly bool
	// Caller, if set, adds the HTTP caller's identity (its address) to
	// each gRPC call's outgoing context, so that the gRPC server judges
	// the call as the HTTP caller's rather than as Conn's (see
	// server.Forwarder). Without it every call is Conn's own.
	Caller func(ctx context.Context, r *http.Request) context.Context
	// CallTimeout bounds each unary call (default 5s).
	CallTimeout time.Duration
	// Logger (default slog.Default()).
	Logger *slog.Logger
}

// DefaultConfig is a writable API with a 5s call timeout; Conn must be set.
func DefaultConfig() Config {
	return Config{CallTimeout: 5 * time.Second}
}

// ErrInvalidConfig is wrapped by every error of Config.Validate, and so
// of New (see package configerr).
var ErrInvalidConfig = errors.New("httpapi: invalid config")

// withDefaults is c with its zero fields set to DefaultConfig's: the one
// place defaults are filled, for New.
func (c Config) withDefaults() Config {
	if c.CallTimeout == 0 {
		c.CallTimeout = DefaultConfig().CallTimeout
	}
	if c.Logger == nil {
		c.Logger = slog.Default()
	}
	return c
}

// Validate reports a missing Conn or a negative CallTimeout (0 takes the
// default), as a *configerr.Error wrapping ErrInvalidConfig.
func (c *Config) Validate() error {
	if c.Conn == nil {
		return configerr.Required(ErrInvalidConfig, "httpapi", "Conn")
	}
	if c.CallTimeout < 0 {
		return configerr.New(ErrInvalidConfig, "httpapi", "CallTimeout", c.CallTimeout, "must be >= 0 (0: the default)")
	}
	return nil
}

// API serves the routes above. It holds no state beyond its Config; it
// is safe for concurrent use.
type API struct {
	cfg Config
	rpc registryv1.RegistryClient
	mux *http.ServeMux
}

// New returns the API; it fails if cfg does not validate.
func New(cfg Config) (*API, error) {
	if err := cfg.Validate(); err != nil {
		return nil, err
	}
	cfg = cfg.withDefaults()
	a := &API{cfg: cfg, rpc: registryv1.NewRegistryClient(cfg.Conn), mux: http.NewServeMux()}
	a.mux.HandleFunc("GET /api/v1/services", a.services)
	a.mux.HandleFunc("GET /api/v1/instances", a.listAll)
	a.mux.HandleFunc("GET /api/v1/services/{service}/instances", a.listService)
	a.mux.HandleFunc("GET /api/v1/services/{service}/instances/{id}", a.get)
	a.mux.HandleFunc("GET /api/v1/status", a.status)
	a.mux.HandleFunc("GET /api/v1/xds/clients", a.xdsClients)
	a.mux.HandleFunc("GET /api/v1/watch", a.watch)
	a.mux.HandleFunc("POST /api/v1/services/{service}/instances/{id}/drain", a.drain)
	a.mux.HandleFunc("POST /api/v1/services/{service}/instances/{id}/undrain", a.undrain)
	a.mux.HandleFunc("GET /api/v1/prometheus/targets", a.prometheusTargets)
	a.mux.HandleFunc("POST /api/v1/services/{service}/instances", a.register)
	a.mux.HandleFunc("POST /api/v1/services/{service}/instances/{id}/keepalive", a.keepAlive)
	a.mux.HandleFunc("DELETE /api/v1/services/{service}/instances/{id}", a.deregister)
	a.mux.HandleFunc("/api/v1/", func(w http.ResponseWriter, r *http.Request) {
		writeError(w, http.StatusNotFound, &apiError{Message: "no route " + r.Method + " " + r.URL.Path, Code: codes.NotFound.String()})
	})
	return a, nil
}

// ReadOnly reports whether drain and undrain are refused.
func (a *API) ReadOnly() bool { return a.cfg.ReadOnly }

// ServeHTTP serves the API. Writes are guarded against cross-site
// requests (a page elsewhere posting to a regnode on localhost) with
// net/http's CrossOriginProtection; curl, which sends no Origin, passes.
func (a *API) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	if err := crossOrigin.Check(r); err != nil {
		writeError(w, http.StatusForbidden, &apiError{Message: "cross-origin request refused: " + err.Error(), Code: codes.PermissionDenied.String()})
		return
	}
	a.mux.ServeHTTP(w, r)
}

var crossOrigin = http.NewCrossOriginProtection()

// apiError is the body of every error response.
type apiError struct {
	Message string `json:"error"`
	// Code is the gRPC code's name ("InvalidArgument", "NotFound", ...).
	Code string `json:"code"`
	// Field names the input at fault, with the names of the JSON API
	// ("service", "id", "from_revision", "reason").
	Field string `json:"field,omitempty"`
	// status is the HTTP status when the code's is not the one (0: by
	// Code, errStatus).
	status int
}

func badField(field, format string, args ...any) *apiError {
	return &apiError{Message: "invalid " + field + ": " + fmt.Sprintf(format, args...), Code: codes.InvalidArgument.String(), Field: field}
}

func writeError(w http.ResponseWriter, code int, e *apiError) {
	writeJSON(w, code, e)
}

func writeJSON(w http.ResponseWriter, code int, v any) {
	w.Header().Set("Content-Type", "application/json")
	w.Header().Set("Cache-Control", "no-store")
	w.WriteHeader(code)
	enc := json.NewEncoder(w)
	enc.SetEscapeHTML(false)
	_ = enc.Encode(v) // the client went away: nothing to tell it
}

// writeRPCError answers with the HTTP status of a gRPC error. An
// InvalidArgument whose message is the server's "invalid FIELD: ..." names
// the field.
func (a *API) writeRPCError(w http.ResponseWriter, r *http.Request, err error) {
	st := status.Convert(err)
	e := &apiError{Message: st.Message(), Code: st.Code().String()}
	if st.Code() == codes.InvalidArgument {
		if rest, ok := strings.CutPrefix(st.Message(), "invalid "); ok {
			if f, _, ok := strings.Cut(rest, ": "); ok && !strings.ContainsAny(f, " ") {
				e.Field = f
			}
			if e.Field == "secret" { // a registration's: sent in a header here
				e.Field = SecretHeader
			}
		}
	}
	code := runtime.HTTPStatusFromCode(st.Code())
	if code >= 500 {
		a.cfg.Logger.Warn("http api call failed", "method", r.Method, "path", r.URL.Path, "err", err)
	}
	writeError(w, code, e)
}

// query checks that r carries no query parameter but allowed ones, so a
// typo (?servce=) is a 400 naming it rather than a silent full list.
func query(r *http.Request, allowed ...string) *apiError {
	for k := range r.URL.Query() {
		found := false
		for _, a := range allowed {
			found = found || k == a
		}
		if !found {
			if len(allowed) == 0 {
				return badField(k, "unknown query parameter (this route takes none)")
			}
			return badField(k, "unknown query parameter (allowed: %s)", strings.Join(allowed, ", "))
		}
	}
	return nil
}

// pathService and pathID read and validate the path's {service} and {id}
// with the registry's own rules.
func pathService(r *http.Request) (string, *apiError) {
	s := r.PathValue("service")
	if err := record.ValidService(s); err != nil {
		return "", fieldError(err, "service")
	}
	return s, nil
}

func pathServiceID(r *http.Request) (string, string, *apiError) {
	s, e := pathService(r)
	if e != nil {
		return "", "", e
	}
	id := r.PathValue("id")
	if err := record.ValidID(id); err != nil {
		return "", "", fieldError(err, "id")
	}
	return s, id, nil
}

func fieldError(err error, field string) *apiError {
	var fe *record.FieldError
	if errors.As(err, &fe) {
		return &apiError{Message: fe.Error(), Code: codes.InvalidArgument.String(), Field: fe.Field}
	}
	return badField(field, "%v", err)
}

func (a *API) call(r *http.Request) (context.Context, context.CancelFunc) {
	return context.WithTimeout(a.callerContext(r), a.cfg.CallTimeout)
}

// callerContext is r's context carrying r's token (forwardAuth) and, with
// Config.Caller, its caller.
func (a *API) callerContext(r *http.Request) context.Context {
	ctx := forwardAuth(r)
	if a.cfg.Caller != nil {
		ctx = a.cfg.Caller(ctx, r)
	}
	return ctx
}

// forwardAuth is r's context carrying r's Authorization header, if any,
// as the gRPC call's "authorization" metadata: the regnode's token check
// judges the HTTP caller exactly as a gRPC one (a drain needs an operate
// token). The header is passed on, never logged or parsed here.
func forwardAuth(r *http.Request) context.Context {
	vals := r.Header.Values("Authorization")
	if len(vals) == 0 {
		return r.Context()
	}
	kv := make([]string, 0, 2*len(vals))
	for _, v := range vals {
		kv = append(kv, "authorization", v)
	}
	return metadata.AppendToOutgoingContext(r.Context(), kv...)
}

func (a *API) list(w http.ResponseWriter, r *http.Request, service string) ([]*registryv1.Instance, bool) {
	ctx, cancel := a.call(r)
	defer cancel()
	resp, err := a.rpc.List(ctx, &registryv1.ListRequest{Service: service})
	if err != nil {
		a.writeRPCError(w, r, err)
		return nil, false
	}
	w.Header().Set("X-Registry-Revision", strconv.FormatInt(resp.GetRevision(), 10))
	return resp.GetInstances(), true
}

func (a *API) services(w http.ResponseWriter, r *http.Request) {
	if e := query(r); e != nil {
		writeError(w, http.StatusBadRequest, e)
		return
	}
	insts, ok := a.list(w, r, "")
	if ok {
		writeJSON(w, http.StatusOK, render.CountServices(insts))
	}
}

func (a *API) listAll(w http.ResponseWriter, r *http.Request) {
	if e := query(r); e != nil {
		writeError(w, http.StatusBadRequest, e)
		return
	}
	if insts, ok := a.list(w, r, ""); ok {
		writeJSON(w, http.StatusOK, render.NewInstances(insts))
	}
}

func (a *API) listService(w http.ResponseWriter, r *http.Request) {
	service, e := pathService(r)
	if e == nil {
		e = query(r)
	}
	if e != nil {
		writeError(w, http.StatusBadRequest, e)
		return
	}
	if insts, ok := a.list(w, r, service); ok {
		writeJSON(w, http.StatusOK, render.NewInstances(insts))
	}
}

func (a *API) get(w http.ResponseWriter, r *http.Request) {
	service, id, e := pathServiceID(r)
	if e == nil {
		e = query(r)
	}
	if e != nil {
		writeError(w, http.StatusBadRequest, e)
		return
	}
	ctx, cancel := a.call(r)
	defer cancel()
	resp, err := a.rpc.Get(ctx, &registryv1.GetRequest{Service: service, Id: id})
	if err != nil {
		a.writeRPCError(w, r, err)
		return
	}
	w.Header().Set("X-Registry-Revision", strconv.FormatInt(resp.GetRevision(), 10))
	writeJSON(w, http.StatusOK, render.NewInstance(resp.GetInstance()))
}

func (a *API) status(w http.ResponseWriter, r *http.Request) {
	if e := query(r, "peers"); e != nil {
		writeError(w, http.StatusBadRequest, e)
		return
	}
	peers, e := boolParam(r, "peers")
	if e != nil {
		writeError(w, http.StatusBadRequest, e)
		return
	}
	ctx, cancel := a.call(r)
	defer cancel()
	resp, err := a.rpc.Status(ctx, &registryv1.StatusRequest{Peers: peers})
	if err != nil {
		a.writeRPCError(w, r, err)
		return
	}
	writeJSON(w, http.StatusOK, render.NewStatus(resp))
}

// drainBody is the optional body of a drain.
type drainBody struct {
	Reason string `json:"reason"`
}

func (a *API) drain(w http.ResponseWriter, r *http.Request) {
	service, id, e := a.writable(r)
	var body drainBody
	if e == nil {
		e = decodeBody(w, r, &body, maxBody)
	}
	if e != nil {
		writeError(w, errStatus(e), e)
		return
	}
	ctx, cancel := a.call(r)
	defer cancel()
	resp, err := a.rpc.Drain(ctx, &registryv1.DrainRequest{Service: service, Id: id, Reason: body.Reason})
	if err != nil {
		a.writeRPCError(w, r, err)
		return
	}
	w.Header().Set("X-Registry-Revision", strconv.FormatInt(resp.GetRevision(), 10))
	writeJSON(w, http.StatusOK, render.NewInstance(resp.GetInstance()))
}

func (a *API) undrain(w http.ResponseWriter, r *http.Request) {
	service, id, e := a.writable(r)
	if e == nil {
		e = decodeBody(w, r, &struct{}{}, maxBody)
	}
	if e != nil {
		writeError(w, errStatus(e), e)
		return
	}
	ctx, cancel := a.call(r)
	defer cancel()
	resp, err := a.rpc.Undrain(ctx, &registryv1.UndrainRequest{Service: service, Id: id})
	if err != nil {
		a.writeRPCError(w, r, err)
		return
	}
	w.Header().Set("X-Registry-Revision", strconv.FormatInt(resp.GetRevision(), 10))
	writeJSON(w, http.StatusOK, render.NewInstance(resp.GetInstance()))
}

// writable checks a write's path and query and refuses it in read-only
// mode.
func (a *API) writable(r *http.Request) (string, string, *apiError) {
	if a.cfg.ReadOnly {
		return "", "", &apiError{Message: "this regnode's HTTP API is read-only: use regctl drain|undrain", Code: codes.PermissionDenied.String()}
	}
	service, id, e := pathServiceID(r)
	if e == nil {
		e = query(r)
	}
	return service, id, e
}

func errStatus(e *apiError) int {
	if e.status != 0 {
		return e.status
	}
	if e.Code == codes.PermissionDenied.String() {
		return http.StatusForbidden
	}
	return http.StatusBadRequest
}

// tooLarge is the 413 of a body over limit bytes.
func tooLarge(limit int64) *apiError {
	e := badField("body", "larger than %d bytes", limit)
	e.status = http.StatusRequestEntityTooLarge
	return e
}

// decodeBody reads an optional JSON object of at most limit bytes into v:
// an empty body is no fields; an unknown field or a value of the wrong
// type is a 400 naming it, a larger body a 413.
func decodeBody(w http.ResponseWriter, r *http.Request, v any, limit int64) *apiError {
	if r.ContentLength > limit {
		// Refused unread: net/http then discards a modest rest and keeps
		// the connection, where a limit hit while reading closes it.
		return tooLarge(limit)
	}
	r.Body = http.MaxBytesReader(w, r.Body, limit)
	dec := json.NewDecoder(r.Body)
	dec.DisallowUnknownFields()
	err := dec.Decode(v)
	if errors.Is(err, io.EOF) {
		return nil
	}
	if err == nil {
		if dec.More() {
			return badField("body", "more than one JSON value")
		}
		return nil
	}
	var te *json.UnmarshalTypeError
	var mbe *http.MaxBytesError
	switch {
	case errors.As(err, &te):
		return badField(te.Field, "must be a JSON %s", te.Type)
	case errors.As(err, &mbe):
		return tooLarge(mbe.Limit)
	}
	if f, ok := strings.CutPrefix(err.Error(), "json: unknown field "); ok {
		f, _ = strconv.Unquote(f)
		return badField(f, "unknown field")
	}
	return badField("body", "not a JSON object: %v", err)
}
