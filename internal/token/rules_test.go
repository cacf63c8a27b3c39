package token_test

import (
	"testing"

	"github.com/regcluster/registry/internal/token"
)

// The whole policy, spelled out: for each role, the methods it may call
// on a service inside its scope. Anything not listed is refused.
var mayCall = map[token.Role][]token.Method{
	token.Read: {token.Get, token.List, token.Watch, token.Status},
	token.Register: {token.Get, token.List, token.Watch, token.Status, token.RegisterCall, token.KeepAlive, token.DeregisterOwn,
		token.DrainOwn, token.UndrainOwn},
	token.Operate: {token.Get, token.List, token.Watch, token.Status, token.DeregisterOwn, token.Deregister, token.Drain, token.Undrain,
		token.DrainOwn, token.UndrainOwn},
	token.Admin: {token.Get, token.List, token.Watch, token.Status, token.RegisterCall, token.KeepAlive, token.DeregisterOwn,
		token.Deregister, token.Drain, token.Undrain, token.DrainOwn, token.UndrainOwn, token.CreateToken, token.ListTokens, token.RevokeToken},
}

var methods = []token.Method{token.Get, token.List, token.Watch, token.Status, token.RegisterCall, token.KeepAlive,
	token.DeregisterOwn, token.Deregister, token.Drain, token.Undrain, token.DrainOwn, token.UndrainOwn, token.CreateToken, token.ListTokens, token.RevokeToken}

// Roles by method, within scope all: every cell of the table.
func TestRolesByMethod(t *testing.T) {
	all := token.Scope{Kind: token.ScopeAll}
	for role, allowed := range mayCall {
		want := map[token.Method]bool{}
		for _, m := range allowed {
			want[m] = true
		}
		for _, m := range methods {
			if got := token.Allowed(role, all, m, "web"); got != want[m] {
				t.Errorf("role %s, %s on web: allowed = %v, want %v", role, m, got, want[m])
			}
		}
	}
	if token.Allowed(token.Admin, all, "Subscribe", "web") {
		t.Error("a method the table does not know is allowed")
	}
}

// Scopes by service: a scope covers its own services only; a call about
// every service ("" on List and Watch) needs scope all; Status is not
// about a service; token calls need admin on scope all.
func TestScopes(t *testing.T) {
	svc := token.Scope{Kind: token.ScopeService, Value: "web"}
	pfx := token.Scope{Kind: token.ScopePrefix, Value: "web-"}
	all := token.Scope{Kind: token.ScopeAll}
	for _, tc := range []struct {
		role    token.Role
		scope   token.Scope
		m       token.Method
		service string
		want    bool
	}{
		{token.Register, svc, token.RegisterCall, "web", true},
		{token.Register, svc, token.RegisterCall, "api", false},
		{token.Register, svc, token.RegisterCall, "web2", false},
		{token.Register, svc, token.RegisterCall, "we", false},
		{token.Read, svc, token.List, "web", true},
		{token.Read, svc, token.List, "", false},
		{token.Read, svc, token.Watch, "", false},
		{token.Read, pfx, token.Watch, "", false},
		{token.Read, all, token.Watch, "", true},
		{token.Read, all, token.List, "", true},
		{token.Read, svc, token.Status, "", true},
		{token.Read, svc, token.Get, "api", false},
		{token.Register, pfx, token.RegisterCall, "web-a", true},
		{token.Register, pfx, token.RegisterCall, "web-", true},
		{token.Register, pfx, token.RegisterCall, "web", false},
		{token.Register, pfx, token.KeepAlive, "api-web-a", false},
		{token.Operate, pfx, token.Drain, "web-a", true},
		{token.Operate, pfx, token.Drain, "api", false},
		{token.Operate, svc, token.Deregister, "web", true},
		{token.Operate, svc, token.Deregister, "api", false},
		{token.Admin, svc, token.Drain, "web", true},
		{token.Admin, svc, token.Drain, "api", false},
		{token.Admin, svc, token.CreateToken, "", false},
		{token.Admin, pfx, token.ListTokens, "", false},
		{token.Admin, all, token.RevokeToken, "", true},
		{token.Operate, all, token.CreateToken, "", false},
	} {
		if got := token.Allowed(tc.role, tc.scope, tc.m, tc.service); got != tc.want {
			t.Errorf("%s on %s: %s %q = %v, want %v", tc.role, tc.scope, tc.m, tc.service, got, tc.want)
		}
	}
}

func TestScopeAndNameValidation(t *testing.T) {
	for _, tc := range []struct {
		s  token.Scope
		ok bool
	}{
		{token.Scope{Kind: token.ScopeAll}, true},
		{token.Scope{Kind: token.ScopeAll, Value: "x"}, false},
		{token.Scope{Kind: token.ScopeService, Value: "web"}, true},
		{token.Scope{Kind: token.ScopeService, Value: "Web"}, false},
		{token.Scope{Kind: token.ScopeService}, false},
		{token.Scope{Kind: token.ScopePrefix, Value: "web-"}, true},
		{token.Scope{Kind: token.ScopePrefix}, false},
		{token.Scope{Kind: token.ScopePrefix, Value: "we/b"}, false},
		{token.Scope{Kind: "everything"}, false},
	} {
		if err := tc.s.Validate(); (err == nil) != tc.ok {
			t.Errorf("%+v: Validate = %v, want ok=%v", tc.s, err, tc.ok)
		}
	}
	for _, tc := range []struct {
		name string
		ok   bool
	}{{"admin", true}, {"web-deployer.2", true}, {"a_b", true}, {"", false}, {"-a", false}, {"Admin", false},
		{"a/b", false}, {"a b", false}, {string(make([]byte, 65)), false}} {
		if err := token.ValidName(tc.name); (err == nil) != tc.ok {
			t.Errorf("ValidName(%q) = %v, want ok=%v", tc.name, err, tc.ok)
		}
	}
}
