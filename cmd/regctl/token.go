package main

import (
	"context"
	"errors"
	"fmt"
	"time"

	"github.com/spf13/cobra"
	"google.golang.org/grpc/codes"
	"google.golang.org/protobuf/types/known/durationpb"

	"github.com/regcluster/registry/internal/render"
	"github.com/regcluster/registry/internal/token"
	registryv1 "github.com/regcluster/registry/proto/registry/v1"
)

// envToken is read when --token is not given.
const envToken = "REGCTL_TOKEN"

// resolveToken is --token, else $REGCTL_TOKEN, else "" (no token). A
// malformed one is a usage error: nothing is sent, and it is not quoted.
func (o *options) resolveToken() (string, error) {
	tok, from := o.token, "--token"
	if tok == "" && o.getenv != nil {
		tok, from = o.getenv(envToken), "$"+envToken
	}
	if tok == "" {
		return "", nil
	}
	if err := token.Parse(tok); err != nil {
		return "", usagef("%s: %v", from, err)
	}
	return tok, nil
}

func newTokenCmd(o *options) *cobra.Command {
	cmd := &cobra.Command{
		Use:   "token",
		Short: "Create, list and revoke scoped tokens (regnodes run with --auth)",
		Long: `Create, list and revoke the scoped tokens of regnodes run with --auth. Every
token command needs an admin token of scope all (--token or $REGCTL_TOKEN);
the first one is in the admin-token file the first regnode wrote.

Roles, each on a scope (one service, a prefix of service names, or all):
  read      get, list, watch, status
  register  read, plus register, keepalive and deregister of its own instances
  operate   read, plus drain, undrain and deregister of any instance
  admin     everything, tokens included`,
		Args: cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error { return cmd.Help() },
	}
	cmd.AddCommand(newTokenCreateCmd(o), newTokenListCmd(o), newTokenRevokeCmd(o))
	return cmd
}

func newTokenCreateCmd(o *options) *cobra.Command {
	var (
		name, role, service, prefix string
		all                         bool
		ttl                         time.Duration
	)
	cmd := &cobra.Command{
		Use:   "create --name N --role R (--service S | --service-prefix P | --all) [--ttl D]",
		Short: "Create a token; its secret is printed once, on stdout",
		Long: `Create a token and print its secret on stdout, the only time it is shown
(the registry keeps only its hash): store it now. -o json prints the token's
fields and its secret.`,
		Example: `  regctl token create --name web-deployer --role register --service web
  regctl token create --name oncall --role operate --all --ttl 12h`,
		Args: nArgs(0, 0, ""),
		RunE: func(cmd *cobra.Command, _ []string) error {
			if name == "" {
				return usagef("--name is required")
			}
			if err := token.ValidName(name); err != nil {
				return usagef("--name: %v", err)
			}
			r, err := token.ParseRole(role)
			if err != nil {
				return usagef("--role: %v", err)
			}
			scope, n := &registryv1.TokenScope{}, 0
			if service != "" {
				scope, n = &registryv1.TokenScope{Kind: registryv1.TokenScope_KIND_SERVICE, Value: service}, n+1
			}
			if prefix != "" {
				scope, n = &registryv1.TokenScope{Kind: registryv1.TokenScope_KIND_PREFIX, Value: prefix}, n+1
			}
			if all {
				scope, n = &registryv1.TokenScope{Kind: registryv1.TokenScope_KIND_ALL}, n+1
			}
			if n != 1 {
				return usagef("give exactly one of --service, --service-prefix and --all")
			}
			if ttl < 0 {
				return usagef("--ttl %s must be positive (omit it for a token that never expires)", ttl)
			}
			req := &registryv1.CreateTokenRequest{Name: name, Role: protoRole(r), Scope: scope}
			if ttl > 0 {
				req.Ttl = durationpb.New(ttl)
			}
			var resp *registryv1.CreateTokenResponse
			if err := o.tokens(cmd.Context(), func(ctx context.Context, api registryv1.TokensClient) (err error) {
				resp, err = api.CreateToken(ctx, req)
				return err
			}); err != nil {
				return err
			}
			if o.json() {
				v := tokenJSON(resp.Token)
				v.Secret = resp.Secret
				return o.printJSON(v)
			}
			fmt.Fprintln(o.stdout, resp.Secret)
			fmt.Fprintf(o.stderr, "created token %s (role %s, scope %s, expires %s): its secret is above, shown this once\n",
				resp.Token.Name, r, scopeString(resp.Token.Scope), expiry(resp.Token))
			return nil
		},
	}
	f := cmd.Flags()
	f.StringVar(&name, "name", "", "the token's name (shown in logs, audit lines and token list; never secret)")
	f.StringVar(&role, "role", "", "read, register, operate or admin")
	f.StringVar(&service, "service", "", "scope: this one service")
	f.StringVar(&prefix, "service-prefix", "", "scope: every service whose name starts with this")
	f.BoolVar(&all, "all", false, "scope: every service")
	f.DurationVar(&ttl, "ttl", 0, "the token expires after this long (default: never)")
	return cmd
}

func newTokenListCmd(o *options) *cobra.Command {
	return &cobra.Command{
		Use:   "list",
		Short: "List tokens: name, role, scope, expiry and last use (never secrets)",
		Long: `List tokens: name, role, scope, expiry, last use and who created it; never a
secret. Last use is as the regnode answering saw it since it started (kept in
memory, never written by a call). -o json prints an array.`,
		Args: nArgs(0, 0, ""),
		RunE: func(cmd *cobra.Command, _ []string) error {
			var resp *registryv1.ListTokensResponse
			if err := o.tokens(cmd.Context(), func(ctx context.Context, api registryv1.TokensClient) (err error) {
				resp, err = api.ListTokens(ctx, &registryv1.ListTokensRequest{})
				return err
			}); err != nil {
				return err
			}
			if o.json() {
				out := make([]tokenView, 0, len(resp.Tokens))
				for _, t := range resp.Tokens {
					out = append(out, tokenJSON(t))
				}
				return o.printJSON(out)
			}
			tw := render.NewTable(o.stdout, "NAME", "ROLE", "SCOPE", "EXPIRES", "LAST USED", "CREATED BY")
			now := time.Now()
			for _, t := range resp.Tokens {
				last := "-"
				if t.LastUsed != nil {
					last = t.LastUsed.AsTime().UTC().Format(time.RFC3339)
				}
				exp := expiry(t)
				if t.Expires != nil && !now.Before(t.Expires.AsTime()) {
					exp += " (expired)"
				}
				tw.Row(t.Name, roleName(t.Role), scopeString(t.Scope), exp, last, t.CreatedBy)
			}
			return tw.Flush()
		},
	}
}

func newTokenRevokeCmd(o *options) *cobra.Command {
	return &cobra.Command{
		Use:   "revoke NAME",
		Short: "Revoke a token: every regnode refuses it within a second",
		Args:  nArgs(1, 1, "one argument (NAME)"),
		RunE: func(cmd *cobra.Command, args []string) error {
			if err := token.ValidName(args[0]); err != nil {
				return usagef("token name: %v", err)
			}
			var resp *registryv1.RevokeTokenResponse
			if err := o.tokens(cmd.Context(), func(ctx context.Context, api registryv1.TokensClient) (err error) {
				resp, err = api.RevokeToken(ctx, &registryv1.RevokeTokenRequest{Name: args[0]})
				return err
			}); err != nil {
				return err
			}
			if o.json() {
				return o.printJSON(map[string]any{"name": args[0], "revoked": true, "revision": resp.Revision})
			}
			fmt.Fprintf(o.stdout, "revoked token %s\n", args[0])
			return nil
		},
	}
}

// tokens runs one Tokens call bounded by --timeout; a regnode without
// --auth (no Tokens service) is said in words.
func (o *options) tokens(ctx context.Context, call func(context.Context, registryv1.TokensClient) error) error {
	c, err := o.connect(nil)
	if err != nil {
		return err
	}
	defer c.Close()
	cctx, cancel := o.callCtx(ctx)
	defer cancel()
	err = call(cctx, c.Tokens())
	if st, ok := grpcStatus(err); ok && st.Code() == codes.Unimplemented {
		return errors.New("this regnode does not run with --auth: it has no tokens")
	}
	return err
}

// tokenView is a token in -o json (snake_case, as every regctl JSON).
type tokenView struct {
	Name      string `json:"name"`
	Role      string `json:"role"`
	Scope     string `json:"scope"`
	Created   string `json:"created,omitempty"`
	Expires   string `json:"expires,omitempty"`
	LastUsed  string `json:"last_used,omitempty"`
	CreatedBy string `json:"created_by,omitempty"`
	Secret    string `json:"secret,omitempty"`
}

func tokenJSON(t *registryv1.TokenInfo) tokenView {
	v := tokenView{Name: t.Name, Role: roleName(t.Role), Scope: scopeString(t.Scope), CreatedBy: t.CreatedBy}
	if t.Created != nil {
		v.Created = t.Created.AsTime().UTC().Format(time.RFC3339)
	}
	if t.Expires != nil {
		v.Expires = t.Expires.AsTime().UTC().Format(time.RFC3339)
	}
	if t.LastUsed != nil {
		v.LastUsed = t.LastUsed.AsTime().UTC().Format(time.RFC3339)
	}
	return v
}

func expiry(t *registryv1.TokenInfo) string {
	if t.Expires == nil {
		return "never"
	}
	return t.Expires.AsTime().UTC().Format(time.RFC3339)
}

var protoRoles = map[token.Role]registryv1.TokenRole{
	token.Read: registryv1.TokenRole_TOKEN_ROLE_READ, token.Register: registryv1.TokenRole_TOKEN_ROLE_REGISTER,
	token.Operate: registryv1.TokenRole_TOKEN_ROLE_OPERATE, token.Admin: registryv1.TokenRole_TOKEN_ROLE_ADMIN,
}

func protoRole(r token.Role) registryv1.TokenRole { return protoRoles[r] }

func roleName(r registryv1.TokenRole) string {
	for k, v := range protoRoles {
		if v == r {
			return string(k)
		}
	}
	return r.String()
}

func scopeString(s *registryv1.TokenScope) string {
	switch s.GetKind() {
	case registryv1.TokenScope_KIND_SERVICE:
		return "service:" + s.Value
	case registryv1.TokenScope_KIND_PREFIX:
		return "prefix:" + s.Value
	case registryv1.TokenScope_KIND_ALL:
		return "all"
	}
	return s.GetKind().String()
}
