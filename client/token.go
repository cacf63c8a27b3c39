package client

import (
	"context"
	"fmt"
	"net"
	"strings"

	"google.golang.org/grpc"
	"google.golang.org/grpc/status"

	"github.com/regcluster/registry/internal/tokenformat"
	registryv1 "github.com/regcluster/registry/proto/registry/v1"
)

// tokenCreds sends the token on every call as "authorization: Bearer".
// New has checked the transport, so it does not ask grpc for one (a
// loopback regnode may serve plaintext).
type tokenCreds struct{ tok string }

func (c tokenCreds) GetRequestMetadata(context.Context, ...string) (map[string]string, error) {
	return map[string]string{"authorization": "Bearer " + c.tok}, nil
}

func (tokenCreds) RequireTransportSecurity() bool { return false }

// tokenOption is the dial option carrying cfg.Token, or nil without one;
// it refuses a malformed token, and a plaintext one to a regnode off
// this host unless cfg.AllowInsecureToken. No error quotes the token.
func tokenOption(cfg Config, eps []string) (grpc.DialOption, error) {
	if cfg.Token == "" {
		return nil, nil
	}
	if err := tokenformat.Parse(cfg.Token); err != nil {
		return nil, fmt.Errorf("Config.Token: %w", err)
	}
	if cfg.TLS == nil && !cfg.AllowInsecureToken {
		for _, ep := range eps {
			if !loopbackEndpoint(ep) {
				return nil, fmt.Errorf("%w: endpoint %s is not on this host and Config.TLS is nil "+
					"(set Config.TLS, or Config.AllowInsecureToken to send it anyway)", ErrInsecureToken, ep)
			}
		}
	}
	return grpc.WithPerRPCCredentials(tokenCreds{tok: cfg.Token}), nil
}

// loopbackEndpoint reports whether host:port is this host: localhost or
// a loopback IP.
func loopbackEndpoint(ep string) bool {
	host, _, err := net.SplitHostPort(strings.TrimSpace(ep))
	if err != nil {
		return false
	}
	if host == "localhost" {
		return true
	}
	ip := net.ParseIP(host)
	return ip != nil && ip.IsLoopback()
}

// Tokens is the raw registry.v1 Tokens client (regnode --auth; admin
// tokens of scope all only).
func (c *Client) Tokens() registryv1.TokensClient { return registryv1.NewTokensClient(c.cc) }

// deniedError is a call refused for its credentials (Unauthenticated,
// PermissionDenied): retrying with the same token cannot succeed, so a
// registration's first attempt stops on it (Permanent) instead of
// retrying until its context ends.
type deniedError struct{ err error }

func (e deniedError) Error() string   { return e.err.Error() }
func (e deniedError) Unwrap() error   { return e.err }
func (e deniedError) Permanent() bool { return true }

// GRPCStatus lets status.FromError see through the wrapper.
func (e deniedError) GRPCStatus() *status.Status { s, _ := status.FromError(e.err); return s }
