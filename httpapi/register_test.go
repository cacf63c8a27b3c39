package httpapi_test

import (
	"context"
	"encoding/base64"
	"encoding/json"
	"fmt"
	"net/http"
	"strings"
	"testing"

	clientv3 "go.etcd.io/etcd/client/v3"

	"github.com/regcluster/registry/httpapi"
	registryv1 "github.com/regcluster/registry/proto/registry/v1"
)

// registryKeys is what the registry holds in etcd (records and saved
// states, with their revisions), to tell that a refused call wrote
// nothing.
func (f *fixture) registryKeys(t *testing.T) string {
	t.Helper()
	var out []string
	for _, prefix := range []string{f.rn.Prefix + "instances/", f.rn.Prefix + "state/"} {
		r, err := f.rn.Etcd.Get(context.Background(), prefix, clientv3.WithPrefix())
		if err != nil {
			t.Fatal(err)
		}
		for _, kv := range r.Kvs {
			out = append(out, fmt.Sprintf("%s@%d", kv.Key, kv.ModRevision))
		}
	}
	return strings.Join(out, " ")
}

// registerHTTP registers over HTTP and returns the answer.
func (f *fixture) registerHTTP(t *testing.T, service, body string, hdr ...string) httpapi.RegisterAnswer {
	t.Helper()
	code, b, _ := f.do(t, "POST", "/api/v1/services/"+service+"/instances", body, hdr...)
	var ans httpapi.RegisterAnswer
	if err := json.Unmarshal(b, &ans); code != http.StatusCreated || err != nil || ans.Secret == "" {
		t.Fatalf("register %s: %d %s (%v)", body, code, b, err)
	}
	return ans
}

// Register, renew and deregister over HTTP: the registration's secret is
// in the 201 answer only, renewals and the owner's DELETE need it (none:
// 401; another's: 403, nothing written), a live id is another's (409),
// and after the DELETE the renewal says the registration is gone.
func TestHTTPRegistration(t *testing.T) {
	f := start(t)
	ans := f.registerHTTP(t, "orders", `{"id":"o-1","address":"127.0.0.1:9001","weight":50,"zone":"z1","version":"1.2",
		"metadata":{"team":"pay"},"check":"http:/healthz"}`)
	if ans.TTL != "10s" || ans.TTLSeconds != 10 || ans.LeaseID == "" || !strings.Contains(string(ans.Instance), `"id":"o-1"`) || !strings.Contains(string(ans.Instance), `"weight":50`) {
		t.Errorf("answer %+v, want the default ttl 10s and the instance", ans)
	}
	inst := instanceInEtcd(t, f.rn, "orders", "o-1")
	if inst.Address != "127.0.0.1:9001" || inst.Zone != "z1" || inst.Version != "1.2" || inst.Metadata["team"] != "pay" ||
		inst.Check.GetKind() != registryv1.CheckKind_CHECK_KIND_HTTP || inst.Check.GetTarget() != "/healthz" {
		t.Errorf("record in etcd: %v", inst)
	}
	if code, b, _ := f.do(t, "GET", "/api/v1/services/orders/instances/o-1", ""); code != 200 || strings.Contains(string(b), ans.Secret) {
		t.Errorf("get: %d, secret shown: %v", code, strings.Contains(string(b), ans.Secret))
	}
	before := f.registryKeys(t)
	for _, c := range []struct {
		method, path, secret string
		code                 int
		says                 string
	}{
		{"POST", "/api/v1/services/orders/instances/o-1/keepalive", "", 401, httpapi.SecretHeader},
		{"POST", "/api/v1/services/orders/instances/o-1/keepalive", "d3Jvbmc=", 403, "PermissionDenied"},
		{"DELETE", "/api/v1/services/orders/instances/o-1", "d3Jvbmc=", 403, "PermissionDenied"},
		{"POST", "/api/v1/services/orders/instances/o-2/keepalive", ans.Secret, 404, "NotFound"},
	} {
		code, b, _ := f.do(t, c.method, c.path, "", httpapi.SecretHeader, c.secret)
		if code != c.code || !strings.Contains(string(b), c.says) {
			t.Errorf("%s %s (secret %q): %d %s, want %d saying %s", c.method, c.path, c.secret, code, b, c.code, c.says)
		}
	}
	code, b, _ := f.do(t, "POST", "/api/v1/services/orders/instances", `{"id":"o-1","address":"127.0.0.1:9009"}`)
	if code != http.StatusConflict || !strings.Contains(string(b), "AlreadyExists") {
		t.Errorf("another's registration of a live id: %d %s, want 409", code, b)
	}
	if after := f.registryKeys(t); after != before {
		t.Errorf("refused calls wrote: %s, then %s", before, after)
	}

	code, b, _ = f.do(t, "POST", "/api/v1/services/orders/instances/o-1/keepalive", "", httpapi.SecretHeader, ans.Secret)
	var ka httpapi.KeepAliveAnswer
	if err := json.Unmarshal(b, &ka); code != 200 || err != nil || ka.LeaseID != ans.LeaseID || ka.TTLSeconds != 10 {
		t.Errorf("keepalive: %d %s, want 200 renewing lease %s", code, b, ans.LeaseID)
	}
	code, b, _ = f.do(t, "DELETE", "/api/v1/services/orders/instances/o-1", "", httpapi.SecretHeader, ans.Secret)
	var del httpapi.DeregisterAnswer
	if err := json.Unmarshal(b, &del); code != 200 || err != nil || !del.Deleted {
		t.Errorf("owner's delete: %d %s", code, b)
	}
	if r, err := f.rn.Etcd.Get(context.Background(), f.rn.Prefix+"instances/orders/o-1"); err != nil || len(r.Kvs) != 0 {
		t.Errorf("the record is still in etcd after the delete: %v %v", r, err)
	}
	if code, b, _ := f.do(t, "POST", "/api/v1/services/orders/instances/o-1/keepalive", "", httpapi.SecretHeader, ans.Secret); code != 404 {
		t.Errorf("keepalive after the delete: %d %s, want 404", code, b)
	}

	// A secret chosen by the client is the registration's (a retry is
	// its own), and a TTL is taken as given.
	mine := base64.RawURLEncoding.EncodeToString([]byte("my own secret of 32 bytes long.."))
	own := f.registerHTTP(t, "orders", `{"id":"o-3","address":"127.0.0.1:9003","ttl":"3s"}`, httpapi.SecretHeader, mine)
	again := f.registerHTTP(t, "orders", `{"id":"o-3","address":"127.0.0.1:9003","ttl":"3s"}`, httpapi.SecretHeader, mine)
	if own.Secret != mine || again.Secret != mine || own.TTL != "3s" {
		t.Errorf("client's own secret: %q then %q, ttl %s", own.Secret, again.Secret, own.TTL)
	}
}

// Bad registrations are a 400 naming the field (413 for a body too large)
// and write nothing.
func TestHTTPRegistrationBadInput(t *testing.T) {
	f := start(t)
	f.register(t, "orders", "o-1", "127.0.0.1:9001")
	before := f.registryKeys(t)
	big := `{"id":"o-2","address":"127.0.0.1:1","metadata":{"k":"` + strings.Repeat("x", 70<<10) + `"}}`
	for _, c := range []struct {
		path, body string
		code       int
		field      string
	}{
		{"/api/v1/services/orders/instances", `{"idd":"o-2","address":"127.0.0.1:1"}`, 400, "idd"},
		{"/api/v1/services/orders/instances", `{"id":"o-2","address":"127.0.0.1:1","weight":"heavy"}`, 400, "weight"},
		{"/api/v1/services/orders/instances", `{"id":"o-2","address":"127.0.0.1:1","weight":5000}`, 400, "weight"},
		{"/api/v1/services/orders/instances", `{"id":"o-2","address":"nowhere"}`, 400, "address"},
		{"/api/v1/services/orders/instances", `{"id":"bad id","address":"127.0.0.1:1"}`, 400, "id"},
		{"/api/v1/services/orders/instances", `{"address":"127.0.0.1:1"}`, 400, "id"},
		{"/api/v1/services/orders/instances", `{"id":"o-2","address":"127.0.0.1:1","check":"icmp"}`, 400, "check"},
		{"/api/v1/services/orders/instances", `{"id":"o-2","address":"127.0.0.1:1","ttl":"1s"}`, 400, "ttl"},
		{"/api/v1/services/orders/instances", `{"id":"o-2","address":"127.0.0.1:1","ttl":"soon"}`, 400, "ttl"},
		{"/api/v1/services/orders/instances", `{"id":"o-2","address":"127.0.0.1:1","metadata":{"k":1}}`, 400, "metadata"},
		{"/api/v1/services/orders/instances", `{"id":"o-2","address":"127.0.0.1:1"}`, 400, httpapi.SecretHeader},
		{"/api/v1/services/orders/instances", `{"id":"o-2"`, 400, "body"},
		{"/api/v1/services/orders/instances", big, 413, "body"},
		{"/api/v1/services/Bad_Name/instances", `{"id":"o-2","address":"127.0.0.1:1"}`, 400, "service"},
	} {
		code, body, _ := f.do(t, "POST", c.path, c.body, httpapi.SecretHeader, map[bool]string{true: "short"}[c.field == httpapi.SecretHeader])
		var e apiErr
		if err := json.Unmarshal(body, &e); err != nil || code != c.code || e.Field != c.field {
			t.Errorf("POST %s %.80s: %d %s, want %d naming %q", c.path, c.body, code, body, c.code, c.field)
		}
	}
	if after := f.registryKeys(t); after != before {
		t.Errorf("bad registrations wrote: %s, then %s", before, after)
	}
}
