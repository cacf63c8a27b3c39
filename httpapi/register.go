package httpapi

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net/http"
	"strconv"
	"time"

	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/types/known/durationpb"

	"github.com/regcluster/registry/internal/checkspec"
	"github.com/regcluster/registry/internal/render"
	registryv1 "github.com/regcluster/registry/proto/registry/v1"
	"github.com/regcluster/registry/record"
)

// Registration over HTTP, for a service that has no SDK: register, renew
// and deregister one instance, each one call of the gRPC API (Register, a
// KeepAlive stream of one request, Deregister), so that validation,
// ownership, tokens, limits and the audit line are the gRPC API's:
//
//	POST   /api/v1/services/{service}/instances             body: RegisterBody
//	       201 RegisterAnswer, with the registration's secret (only here)
//	POST   /api/v1/services/{service}/instances/{id}/keepalive
//	       200 KeepAliveAnswer; 404 once the lease is lost (register again,
//	       with the secret, to come back with the state the record had)
//	DELETE /api/v1/services/{service}/instances/{id}
//	       200 DeregisterAnswer
//
// The secret travels in the SecretHeader header, never in a URL: it is
// required to renew, and a DELETE with it is the owner's; a DELETE
// without it is an operator's, allowed where the gRPC API allows one (an
// operate token with --auth; without auth, a caller on the regnode's own
// host, judged by the HTTP caller's address: see Config.Caller). On a
// registration the header, if given, is the secret to register with (a
// retry, or a comeback after a lost lease). gRPC codes become HTTP
// statuses as everywhere in the API: InvalidArgument 400 naming the
// field, Unauthenticated 401, PermissionDenied 403, NotFound 404,
// AlreadyExists 409, ResourceExhausted 429.

// SecretHeader carries a registration's secret.
const SecretHeader = "X-Registration-Secret"

// maxRegisterBody bounds a registration's body: a record is at most
// 16 KiB, and this leaves room for JSON's escaping.
const maxRegisterBody = 64 << 10

// RegisterBody is the JSON of a registration: regctl register's fields
// under the JSON names of regctl -o json. Zero fields take the registry's
// defaults (weight 100, ttl 10s, no check).
type RegisterBody struct {
	ID       string            `json:"id"`
	Address  string            `json:"address"`
	Weight   uint32            `json:"weight,omitempty"`
	Zone     string            `json:"zone,omitempty"`
	Version  string            `json:"version,omitempty"`
	Metadata map[string]string `json:"metadata,omitempty"`
	// Check is regctl's --check: tcp, http:PATH, grpc[:SERVICE] or none.
	Check string `json:"check,omitempty"`
	// TTL is the lease's time to live, a Go duration ("10s"; 2s..1h).
	TTL string `json:"ttl,omitempty"`
}

// RegisterAnswer is a registration's 201 body.
type RegisterAnswer struct {
	// LeaseID is the lease, in hex as regctl prints it.
	LeaseID string `json:"lease_id"`
	// TTL is the lease's TTL as a Go duration, TTLSeconds in seconds:
	// renew well within it (a third of it).
	TTL        string `json:"ttl"`
	TTLSeconds int64  `json:"ttl_seconds"`
	// Secret is the registration's: keep it to renew and deregister. It
	// is never shown again.
	Secret   string `json:"secret"`
	Revision int64  `json:"revision"`
	// Instance is the record as registered, in regctl's JSON field names
	// (what GET .../instances/{id} answers).
	Instance json.RawMessage `json:"instance"`
}

// KeepAliveAnswer is a renewal's 200 body.
type KeepAliveAnswer struct {
	LeaseID    string `json:"lease_id"`
	TTL        string `json:"ttl"`
	TTLSeconds int64  `json:"ttl_seconds"`
}

// DeregisterAnswer is a deregistration's 200 body.
type DeregisterAnswer struct {
	// Deleted says whether a record was deleted (false: it was gone).
	Deleted  bool  `json:"deleted"`
	Revision int64 `json:"revision"`
}

func ttlText(seconds int64) string { return (time.Duration(seconds) * time.Second).String() }

func (a *API) register(w http.ResponseWriter, r *http.Request) {
	service, e := pathService(r)
	if e == nil {
		e = query(r)
	}
	var body RegisterBody
	if e == nil {
		e = decodeBody(w, r, &body, maxRegisterBody)
	}
	req := &registryv1.RegisterRequest{Secret: r.Header.Get(SecretHeader), Instance: &registryv1.Instance{
		Service: service, Id: body.ID, Address: body.Address, Weight: body.Weight,
		Zone: body.Zone, Version: body.Version, Metadata: body.Metadata}}
	if e == nil {
		var err error
		if req.Instance.Check, err = checkspec.Parse(body.Check); err != nil {
			e = badField("check", "%v", err)
		}
	}
	if e == nil && body.TTL != "" {
		ttl, err := time.ParseDuration(body.TTL)
		if err != nil {
			e = badField("ttl", "%q is not a duration (e.g. \"10s\")", body.TTL)
		} else if err := record.ValidTTL(ttl); err != nil {
			e = fieldError(err, "ttl")
		}
		req.Ttl = durationpb.New(ttl)
	}
	if e != nil {
		writeError(w, errStatus(e), e)
		return
	}
	ctx, cancel := a.call(r)
	defer cancel()
	resp, err := a.rpc.Register(ctx, req)
	if err != nil {
		a.writeRPCError(w, r, err)
		return
	}
	w.Header().Set("X-Registry-Revision", strconv.FormatInt(resp.GetRevision(), 10))
	w.Header().Set("Location", Prefix+"services/"+service+"/instances/"+resp.GetInstance().GetId())
	inst, err := json.Marshal(render.NewInstance(resp.GetInstance()))
	if err != nil {
		a.writeRPCError(w, r, status.Errorf(codes.Internal, "encode the instance: %v", err))
		return
	}
	writeJSON(w, http.StatusCreated, RegisterAnswer{LeaseID: render.HexID(uint64(resp.GetLeaseId())),
		TTL: ttlText(resp.GetTtlSeconds()), TTLSeconds: resp.GetTtlSeconds(), Secret: resp.GetSecret(),
		Revision: resp.GetRevision(), Instance: inst})
}

// ownerCall checks a keepalive's or deregistration's path, query and
// (empty) body, and returns its service, id and secret.
func ownerCall(w http.ResponseWriter, r *http.Request) (string, string, string, *apiError) {
	service, id, e := pathServiceID(r)
	if e == nil {
		e = query(r)
	}
	if e == nil {
		e = decodeBody(w, r, &struct{}{}, maxBody)
	}
	return service, id, r.Header.Get(SecretHeader), e
}

// keepAlive renews the lease of the registration service/id once, for
// the holder of its secret: the record's own lease (read with Get), on a
// KeepAlive stream opened for this one request.
func (a *API) keepAlive(w http.ResponseWriter, r *http.Request) {
	service, id, secret, e := ownerCall(w, r)
	if e == nil && secret == "" {
		e = &apiError{Message: "the " + SecretHeader + " header is required: the secret the registration returned",
			Code: codes.Unauthenticated.String(), Field: SecretHeader, status: http.StatusUnauthorized}
	}
	if e != nil {
		writeError(w, errStatus(e), e)
		return
	}
	ctx, cancel := a.call(r)
	defer cancel()
	got, err := a.rpc.Get(ctx, &registryv1.GetRequest{Service: service, Id: id})
	if err != nil {
		a.writeRPCError(w, r, err)
		return
	}
	resp, err := a.renewOnce(ctx, &registryv1.KeepAliveRequest{LeaseId: got.GetInstance().GetLeaseId(),
		Service: service, Id: id, Secret: secret})
	if err != nil {
		a.writeRPCError(w, r, err)
		return
	}
	if resp.GetLost() {
		writeError(w, http.StatusNotFound, &apiError{Message: fmt.Sprintf("%s/%s: the lease is lost: register again (with %s, to keep the record's state)",
			service, id, SecretHeader), Code: codes.NotFound.String()})
		return
	}
	writeJSON(w, http.StatusOK, KeepAliveAnswer{LeaseID: render.HexID(uint64(resp.GetLeaseId())),
		TTL: ttlText(resp.GetTtlSeconds()), TTLSeconds: resp.GetTtlSeconds()})
}

// renewOnce sends req on a KeepAlive stream of its own and returns the
// answer; the stream ends with the call.
func (a *API) renewOnce(ctx context.Context, req *registryv1.KeepAliveRequest) (*registryv1.KeepAliveResponse, error) {
	ctx, cancel := context.WithCancel(ctx)
	defer cancel() // ends the stream whatever happened
	stream, err := a.rpc.KeepAlive(ctx)
	if err != nil {
		return nil, err
	}
	if err := stream.Send(req); err != nil {
		// The server ended the stream: Recv says why.
		if _, rerr := stream.Recv(); rerr != nil {
			return nil, rerr
		}
		return nil, err
	}
	if err := stream.CloseSend(); err != nil {
		return nil, err
	}
	resp, err := stream.Recv()
	if errors.Is(err, io.EOF) {
		return nil, fmt.Errorf("keepalive stream ended without an answer: %w", err)
	}
	return resp, err
}

// deregister ends the registration service/id: the owner's, with its
// secret; an operator's without.
func (a *API) deregister(w http.ResponseWriter, r *http.Request) {
	service, id, secret, e := ownerCall(w, r)
	if e == nil && secret == "" && a.cfg.ReadOnly && a.cfg.Caller == nil {
		// Without Caller the gRPC API would judge this API's own
		// connection, not the caller: keep to the read-only rule.
		e = &apiError{Message: "this regnode's HTTP API is read-only: deregister with " + SecretHeader + ", or use regctl deregister",
			Code: codes.PermissionDenied.String()}
	}
	if e != nil {
		writeError(w, errStatus(e), e)
		return
	}
	ctx, cancel := a.call(r)
	defer cancel()
	resp, err := a.rpc.Deregister(ctx, &registryv1.DeregisterRequest{Service: service, Id: id, Secret: secret})
	if err != nil {
		a.writeRPCError(w, r, err)
		return
	}
	w.Header().Set("X-Registry-Revision", strconv.FormatInt(resp.GetRevision(), 10))
	writeJSON(w, http.StatusOK, DeregisterAnswer{Deleted: resp.GetDeleted(), Revision: resp.GetRevision()})
}
