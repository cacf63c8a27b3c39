package token

import (
	"context"
	"fmt"
	"strings"
	"time"

	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/metadata"
	"google.golang.org/grpc/status"
)

// Method is a call as the check sees it: a registry.v1 method, with a
// Deregister told apart by whether it carries the registration's secret.
type Method string

// The methods a token may be allowed.
const (
	Get           Method = "Get"
	List          Method = "List"
	Watch         Method = "Watch"
	Status        Method = "Status"
	RegisterCall  Method = "Register"
	KeepAlive     Method = "KeepAlive"
	DeregisterOwn Method = "DeregisterOwn" // with the registration's secret: the owner's
	Deregister    Method = "Deregister"    // without: an operator's, of any instance
	Drain         Method = "Drain"         // without the registration's secret: an operator's
	Undrain       Method = "Undrain"       // likewise
	DrainOwn      Method = "DrainOwn"      // with the secret: the owner's, before it deregisters
	UndrainOwn    Method = "UndrainOwn"    // with the secret
	CreateToken   Method = "CreateToken"
	ListTokens    Method = "ListTokens"
	RevokeToken   Method = "RevokeToken"
)

// rule is who may call a method: the roles allowed, the one named to a
// caller refused, and whether the call is about services at all (Status
// and the token calls are not: their scope is checked apart).
type rule struct {
	roles    []Role
	need     Role
	services bool // the call names a service (or "" for every service) to check the scope against
	all      bool // the call needs scope all
}

// rules is the whole policy, one line per method (table-tested).
var rules = map[Method]rule{
	Get:           {roles: []Role{Read, Register, Operate, Admin}, need: Read, services: true},
	List:          {roles: []Role{Read, Register, Operate, Admin}, need: Read, services: true},
	Watch:         {roles: []Role{Read, Register, Operate, Admin}, need: Read, services: true},
	Status:        {roles: []Role{Read, Register, Operate, Admin}, need: Read},
	RegisterCall:  {roles: []Role{Register, Admin}, need: Register, services: true},
	KeepAlive:     {roles: []Role{Register, Admin}, need: Register, services: true},
	DeregisterOwn: {roles: []Role{Register, Operate, Admin}, need: Register, services: true},
	Deregister:    {roles: []Role{Operate, Admin}, need: Operate, services: true},
	Drain:         {roles: []Role{Operate, Admin}, need: Operate, services: true},
	DrainOwn:      {roles: []Role{Register, Operate, Admin}, need: Register, services: true},
	UndrainOwn:    {roles: []Role{Register, Operate, Admin}, need: Register, services: true},
	Undrain:       {roles: []Role{Operate, Admin}, need: Operate, services: true},
	CreateToken:   {roles: []Role{Admin}, need: Admin, all: true},
	ListTokens:    {roles: []Role{Admin}, need: Admin, all: true},
	RevokeToken:   {roles: []Role{Admin}, need: Admin, all: true},
}

// Allowed reports whether role r on scope s may call m on service ("":
// every service). It is the policy without a token: Check applies it.
func Allowed(r Role, s Scope, m Method, service string) bool {
	return allowed(r, s, m, service) == nil
}

// allowed is nil, or the PermissionDenied reason (without the token's name).
func allowed(r Role, s Scope, m Method, service string) error {
	ru, ok := rules[m]
	if !ok {
		return fmt.Errorf("method %s is not open to tokens", m)
	}
	roleOK := false
	for _, x := range ru.roles {
		roleOK = roleOK || x == r
	}
	what := "service " + service
	if service == "" {
		what = "every service"
	}
	switch {
	case !roleOK && ru.services:
		return fmt.Errorf("%s on %s needs role %s (or admin), not %s", m, what, ru.need, r)
	case !roleOK:
		return fmt.Errorf("%s needs role %s, not %s", m, ru.need, r)
	case ru.all && s.Kind != ScopeAll:
		return fmt.Errorf("%s needs role %s on scope all, not on %s", m, ru.need, s)
	case ru.services && !s.Covers(service):
		return fmt.Errorf("%s on %s needs role %s on %s; the token's scope is %s", m, what, ru.need, scopeNeeded(service), s)
	}
	return nil
}

func scopeNeeded(service string) string {
	if service == "" {
		return "scope all"
	}
	return "service " + service
}

// Check is the decision on one call: the record of the token that may
// make it, or a gRPC status error: Unauthenticated (no token, a
// malformed, unknown, revoked or expired one) or PermissionDenied (the
// token's role or scope does not allow m on service, naming both and the
// role needed). No error quotes the token. A granted call counts as the
// token's last use on this regnode; a refused one does not.
func (c *Cache) Check(tok string, m Method, service string) (*Record, error) {
	r, err := c.Authenticate(tok)
	if err != nil {
		return nil, err
	}
	if err := c.Authorize(r, m, service); err != nil {
		return nil, err
	}
	return r, nil
}

// Authenticate is the record of tok, or Unauthenticated (Unavailable
// before the cache's first list), without touching its last use.
func (c *Cache) Authenticate(tok string) (*Record, error) {
	if tok == "" {
		return nil, status.Error(codes.Unauthenticated, "this regnode runs with --auth: send a token (authorization: Bearer regtok_...; regctl --token or $REGCTL_TOKEN)")
	}
	if err := Parse(tok); err != nil {
		return nil, status.Errorf(codes.Unauthenticated, "the token sent is malformed: %v", err)
	}
	select {
	case <-c.ready:
	default:
		return nil, status.Error(codes.Unavailable, "this regnode has not loaded its tokens from etcd yet; try again or another regnode")
	}
	r := c.lookup(Hash(tok))
	switch {
	case r == nil:
		return nil, status.Error(codes.Unauthenticated, "the token sent is unknown or revoked")
	case r.Expired(c.now()):
		return nil, status.Errorf(codes.Unauthenticated, "token %s expired at %s", r.Name, r.Expires.UTC().Format(time.RFC3339))
	}
	return r, nil
}

// ByName is the record of the token named name, for a caller identified
// otherwise than by the token itself (an xDS client's verified client
// certificate): Unauthenticated when no such token is live.
func (c *Cache) ByName(name string) (*Record, error) {
	select {
	case <-c.ready:
	default:
		return nil, status.Error(codes.Unavailable, "this regnode has not loaded its tokens from etcd yet; try again or another regnode")
	}
	c.mu.RLock()
	r := c.byName[name]
	c.mu.RUnlock()
	switch {
	case r == nil:
		return nil, status.Errorf(codes.Unauthenticated, "no token is named %q (the client certificate's common name): create one with that name", name)
	case r.Expired(c.now()):
		return nil, status.Errorf(codes.Unauthenticated, "token %s expired at %s", r.Name, r.Expires.UTC().Format(time.RFC3339))
	}
	return r, nil
}

// Authorize is nil if r may call m on service (and counts the use), or
// PermissionDenied naming the token, the service and the role needed.
func (c *Cache) Authorize(r *Record, m Method, service string) error {
	if err := allowed(r.Role, r.Scope, m, service); err != nil {
		return status.Errorf(codes.PermissionDenied, "token %s: %v", r.Name, err)
	}
	c.used(r.Name, c.now())
	return nil
}

// FromIncoming is the token a call carries in its "authorization"
// metadata as "Bearer <token>" (the scheme in any case, as HTTP has it),
// "" if it carries none. More than one value, another scheme, or a value
// that is not a token is an error wrapping ErrBadHeader (or ErrMalformed),
// which never quotes what was sent.
func FromIncoming(ctx context.Context) (string, error) {
	md, _ := metadata.FromIncomingContext(ctx)
	vals := md.Get("authorization")
	switch len(vals) {
	case 0:
		return "", nil
	case 1:
	default:
		return "", fmt.Errorf("%w: %d authorization values, want one", ErrBadHeader, len(vals))
	}
	scheme, tok, ok := strings.Cut(vals[0], " ")
	if !ok || !strings.EqualFold(scheme, "bearer") {
		return "", fmt.Errorf("%w: want \"Bearer <token>\"", ErrBadHeader)
	}
	if err := Parse(tok); err != nil {
		return "", err
	}
	return tok, nil
}

type ctxKey struct{}

// WithRecord is ctx carrying r, the token a call was allowed by.
func WithRecord(ctx context.Context, r *Record) context.Context {
	return context.WithValue(ctx, ctxKey{}, r)
}

// FromContext is the token a call was allowed by, if auth is on.
func FromContext(ctx context.Context) (*Record, bool) {
	r, ok := ctx.Value(ctxKey{}).(*Record)
	return r, ok
}
