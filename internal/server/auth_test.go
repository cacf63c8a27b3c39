package server_test

import (
	"context"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/credentials/insecure"
	"google.golang.org/grpc/metadata"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/encoding/prototext"
	"google.golang.org/protobuf/types/known/durationpb"

	"github.com/regcluster/registry/client"
	"github.com/regcluster/registry/internal/embedded"
	"github.com/regcluster/registry/internal/etcdtest"
	"github.com/regcluster/registry/internal/node"
	"github.com/regcluster/registry/internal/peerlimit"
	"github.com/regcluster/registry/internal/regnodetest"
	registryv1 "github.com/regcluster/registry/proto/registry/v1"
)

// authNode is a regnode with --auth on an etcd of its own, and its first
// admin token, read from the file it wrote.
func authNode(t *testing.T, limits peerlimit.Config) (*regnodetest.Regnode, string) {
	t.Helper()
	m := etcdtest.Start(t, false)
	dir := t.TempDir()
	rn := regnodetest.StartWith(t, node.Config{EtcdEndpoints: []string{m.ClientURL}, Auth: true,
		Embed: embedded.Config{Dir: dir}, Limits: limits}, m.ClientURL)
	b, err := os.ReadFile(filepath.Join(dir, node.AdminTokenFile))
	if err != nil {
		t.Fatalf("the first admin token: %v", err)
	}
	return rn, strings.TrimSpace(string(b))
}

// as is an SDK client of rn sending tok (none if "").
func as(t *testing.T, rn *regnodetest.Regnode, tok string) *client.Client {
	t.Helper()
	c, err := client.New(client.Config{Endpoints: []string{rn.Addr}, Token: tok})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { c.Close() })
	return c
}

func ctx10(t *testing.T) context.Context {
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	t.Cleanup(cancel)
	return ctx
}

func mkToken(t *testing.T, admin *client.Client, name string, role registryv1.TokenRole, kind registryv1.TokenScope_Kind, value string) string {
	t.Helper()
	resp, err := admin.Tokens().CreateToken(ctx10(t), &registryv1.CreateTokenRequest{Name: name, Role: role,
		Scope: &registryv1.TokenScope{Kind: kind, Value: value}})
	if err != nil {
		t.Fatalf("create token %s: %v", name, err)
	}
	return resp.Secret
}

// Every method under every role that matters, over the real interceptors:
// each refusal has the right code, names what is missing and writes
// nothing.
func TestAuthRoles(t *testing.T) {
	rn, adminTok := authNode(t, peerlimit.Config{})
	admin := as(t, rn, adminTok)
	regTok := mkToken(t, admin, "web-reg", registryv1.TokenRole_TOKEN_ROLE_REGISTER, registryv1.TokenScope_KIND_SERVICE, "web")
	readWebTok := mkToken(t, admin, "web-read", registryv1.TokenRole_TOKEN_ROLE_READ, registryv1.TokenScope_KIND_SERVICE, "web")
	readAllTok := mkToken(t, admin, "reader", registryv1.TokenRole_TOKEN_ROLE_READ, registryv1.TokenScope_KIND_ALL, "")
	operTok := mkToken(t, admin, "oncall", registryv1.TokenRole_TOKEN_ROLE_OPERATE, registryv1.TokenScope_KIND_PREFIX, "we")
	reg, readWeb, readAll, oper := as(t, rn, regTok).API(), as(t, rn, readWebTok).API(), as(t, rn, readAllTok).API(), as(t, rn, operTok).API()
	none := as(t, rn, "").API()

	// No token, or a malformed one: Unauthenticated, nothing written.
	rev := headRev(t, rn.Etcd)
	_, err := none.Register(ctx10(t), &registryv1.RegisterRequest{Instance: inst("web", "w-1")})
	refused(t, rn, "Register without a token", err, codes.Unauthenticated, "send a token", rev)
	cc, err := grpc.NewClient(rn.Addr, grpc.WithTransportCredentials(insecure.NewCredentials()))
	if err != nil {
		t.Fatal(err)
	}
	defer cc.Close()
	raw := registryv1.NewRegistryClient(cc)
	for _, v := range []string{"Bearer hunter2", "Basic " + adminTok, adminTok} {
		mctx := metadata.AppendToOutgoingContext(ctx10(t), "authorization", v)
		_, err := raw.Drain(mctx, &registryv1.DrainRequest{Service: "web", Id: "w-1"})
		refused(t, rn, "Drain with authorization "+v[:5]+"...", err, codes.Unauthenticated, "authorization metadata", rev)
		if strings.Contains(err.Error(), adminTok[8:]) {
			t.Fatalf("the refusal quotes the token: %v", err)
		}
	}

	// register on web: registers web, not api; cannot drain another's,
	// drains its own with the secret.
	resp, err := reg.Register(ctx10(t), &registryv1.RegisterRequest{Instance: inst("web", "w-1"), Ttl: durationpb.New(time.Minute)})
	if err != nil {
		t.Fatalf("register web with a register token of web: %v", err)
	}
	rev = headRev(t, rn.Etcd)
	_, err = reg.Register(ctx10(t), &registryv1.RegisterRequest{Instance: inst("api", "a-1")})
	refused(t, rn, "Register api", err, codes.PermissionDenied, "Register on service api needs role register on service api", rev)
	_, err = reg.Drain(ctx10(t), &registryv1.DrainRequest{Service: "web", Id: "w-1"})
	refused(t, rn, "operator Drain by register", err, codes.PermissionDenied, "needs role operate", rev)
	_, err = reg.Deregister(ctx10(t), &registryv1.DeregisterRequest{Service: "web", Id: "w-1"})
	refused(t, rn, "operator Deregister by register", err, codes.PermissionDenied, "needs role operate", rev)
	wrong := "x" + resp.Secret[1:]
	if wrong == resp.Secret { // the secret began with x: change it all the same
		wrong = "y" + resp.Secret[1:]
	}
	_, err = reg.Drain(ctx10(t), &registryv1.DrainRequest{Service: "web", Id: "w-1", Secret: wrong})
	refused(t, rn, "owner Drain with another secret", err, codes.PermissionDenied, "not this registration's", rev)
	_, err = reg.Get(ctx10(t), &registryv1.GetRequest{Service: "", Id: "w-1"})
	refused(t, rn, "Get without a service", err, codes.InvalidArgument, "service", rev)
	ka, err := reg.KeepAlive(ctx10(t))
	if err != nil {
		t.Fatal(err)
	}
	if err := ka.Send(&registryv1.KeepAliveRequest{LeaseId: resp.LeaseId, Service: "web", Id: "w-1", Secret: resp.Secret}); err != nil {
		t.Fatal(err)
	}
	if _, err := ka.Recv(); err != nil {
		t.Fatalf("keepalive of its own: %v", err)
	}
	if err := ka.Send(&registryv1.KeepAliveRequest{LeaseId: resp.LeaseId, Service: "api", Id: "w-1", Secret: resp.Secret}); err != nil {
		t.Fatal(err)
	}
	_, err = ka.Recv()
	refused(t, rn, "KeepAlive message of api", err, codes.PermissionDenied, "service api", rev)
	if _, err := reg.Drain(ctx10(t), &registryv1.DrainRequest{Service: "web", Id: "w-1", Secret: resp.Secret, Reason: "stopping"}); err != nil {
		t.Fatalf("the owner's drain with a register token: %v", err)
	}
	if _, err := reg.Undrain(ctx10(t), &registryv1.UndrainRequest{Service: "web", Id: "w-1", Secret: resp.Secret}); err != nil {
		t.Fatalf("the owner's undrain with a register token: %v", err)
	}

	// read: lists, gets and watches within its scope; writes nothing.
	rev = headRev(t, rn.Etcd)
	if l, err := readWeb.List(ctx10(t), &registryv1.ListRequest{Service: "web"}); err != nil || len(l.Instances) != 1 {
		t.Fatalf("list web with read on web: %v, %v", l, err)
	}
	if _, err := readWeb.Get(ctx10(t), &registryv1.GetRequest{Service: "web", Id: "w-1"}); err != nil {
		t.Fatal(err)
	}
	_, err = readWeb.List(ctx10(t), &registryv1.ListRequest{})
	refused(t, rn, "List of every service with read on web", err, codes.PermissionDenied, "scope all", rev)
	ws, err := readWeb.Watch(ctx10(t), &registryv1.WatchRequest{})
	if err == nil {
		_, err = ws.Recv()
	}
	refused(t, rn, "Watch of every service with read on web", err, codes.PermissionDenied, "Watch on every service needs role read on scope all", rev)
	for _, c := range []registryv1.RegistryClient{readWeb, readAll} {
		ws, err := c.Watch(ctx10(t), &registryv1.WatchRequest{Service: "web"})
		if err != nil {
			t.Fatal(err)
		}
		if m, err := ws.Recv(); err != nil || m.GetSnapshot() == nil {
			t.Fatalf("watch web with a read token: %v, %v", m, err)
		}
	}
	if ws, err := readAll.Watch(ctx10(t), &registryv1.WatchRequest{}); err != nil {
		t.Fatal(err)
	} else if _, err := ws.Recv(); err != nil {
		t.Fatalf("watch of every service with read on all: %v", err)
	}
	if _, err := readAll.Status(ctx10(t), &registryv1.StatusRequest{}); err != nil {
		t.Fatal(err)
	}
	// xDS clients follow every service: read on all, as an xDS stream.
	_, err = readWeb.XdsClients(ctx10(t), &registryv1.XdsClientsRequest{All: true})
	refused(t, rn, "XdsClients with read on web", err, codes.PermissionDenied, "scope all", rev)
	if _, err := readAll.XdsClients(ctx10(t), &registryv1.XdsClientsRequest{All: true}); err != nil {
		t.Fatalf("XdsClients with read on all: %v", err)
	}
	_, err = readAll.Register(ctx10(t), &registryv1.RegisterRequest{Instance: inst("web", "w-2")})
	refused(t, rn, "Register with read", err, codes.PermissionDenied, "needs role register", rev)
	_, err = readAll.Undrain(ctx10(t), &registryv1.UndrainRequest{Service: "web", Id: "w-1"})
	refused(t, rn, "Undrain with read", err, codes.PermissionDenied, "needs role operate", rev)
	_, err = as(t, rn, regTok).Tokens().CreateToken(ctx10(t), &registryv1.CreateTokenRequest{Name: "mine",
		Role: registryv1.TokenRole_TOKEN_ROLE_ADMIN, Scope: &registryv1.TokenScope{Kind: registryv1.TokenScope_KIND_ALL}})
	refused(t, rn, "CreateToken with register", err, codes.PermissionDenied, "needs role admin", rev)

	// operate on prefix "we": drains and removes web, nothing else.
	if _, err := oper.Drain(ctx10(t), &registryv1.DrainRequest{Service: "web", Id: "w-1", Reason: "maintenance"}); err != nil {
		t.Fatalf("drain with operate: %v", err)
	}
	rev = headRev(t, rn.Etcd)
	_, err = oper.Drain(ctx10(t), &registryv1.DrainRequest{Service: "api", Id: "a-1"})
	refused(t, rn, "Drain api with operate on we*", err, codes.PermissionDenied, "service api", rev)
	if _, err := oper.Deregister(ctx10(t), &registryv1.DeregisterRequest{Service: "web", Id: "w-1"}); err != nil {
		t.Fatalf("operator deregister with operate: %v", err)
	}

	// The list shows who was used, and never a secret.
	lt, err := admin.Tokens().ListTokens(ctx10(t), &registryv1.ListTokensRequest{})
	if err != nil {
		t.Fatal(err)
	}
	text := prototext.Format(lt)
	for _, sec := range []string{adminTok, regTok, readWebTok, readAllTok, operTok} {
		if strings.Contains(text, sec[7:]) {
			t.Fatal("ListTokens shows a secret")
		}
	}
	used := map[string]bool{}
	for _, ti := range lt.Tokens {
		used[ti.Name] = ti.LastUsed != nil
	}
	if len(used) != 5 || !used["web-reg"] || !used["oncall"] || !used["admin"] {
		t.Fatalf("tokens and their use: %v", used)
	}
}

// With auth, the write limits are per token: one token's flood is
// refused while another's writes go through.
func TestLimitsPerToken(t *testing.T) {
	lim := peerlimit.DefaultConfig()
	lim.WriteRate, lim.WriteBurst = 0.001, 3
	rn, adminTok := authNode(t, lim)
	admin := as(t, rn, adminTok)
	a := as(t, rn, mkToken(t, admin, "flood", registryv1.TokenRole_TOKEN_ROLE_REGISTER, registryv1.TokenScope_KIND_ALL, "")).API()
	b := as(t, rn, mkToken(t, admin, "quiet", registryv1.TokenRole_TOKEN_ROLE_REGISTER, registryv1.TokenScope_KIND_ALL, "")).API()
	var limited error
	for i := 0; i < 10 && limited == nil; i++ {
		_, limited = a.Register(ctx10(t), &registryv1.RegisterRequest{Instance: inst("web", "f-"+string(rune('a'+i)))})
	}
	if status.Code(limited) != codes.ResourceExhausted || !strings.Contains(limited.Error(), "token flood") {
		t.Fatalf("the flooding token: %v, want ResourceExhausted naming token flood", limited)
	}
	if _, err := b.Register(ctx10(t), &registryv1.RegisterRequest{Instance: inst("web", "q-1")}); err != nil {
		t.Fatalf("another token, from the same address, during the flood: %v", err)
	}
}

// A revoke ends what the token has open: a Watch at once, a KeepAlive at
// its next request, both Unauthenticated.
func TestRevokeEndsStreams(t *testing.T) {
	rn, adminTok := authNode(t, peerlimit.Config{})
	admin := as(t, rn, adminTok)
	readTok := mkToken(t, admin, "reader", registryv1.TokenRole_TOKEN_ROLE_READ, registryv1.TokenScope_KIND_ALL, "")
	regTok := mkToken(t, admin, "web-reg", registryv1.TokenRole_TOKEN_ROLE_REGISTER, registryv1.TokenScope_KIND_SERVICE, "web")
	reader, reg := as(t, rn, readTok).API(), as(t, rn, regTok).API()

	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	ws, err := reader.Watch(ctx, &registryv1.WatchRequest{})
	if err != nil {
		t.Fatal(err)
	}
	if _, err := ws.Recv(); err != nil {
		t.Fatal(err)
	}
	resp, err := reg.Register(ctx, &registryv1.RegisterRequest{Instance: inst("web", "w-1"), Ttl: durationpb.New(time.Minute)})
	if err != nil {
		t.Fatal(err)
	}
	ka, err := reg.KeepAlive(ctx)
	if err != nil {
		t.Fatal(err)
	}
	renew := func() error {
		if err := ka.Send(&registryv1.KeepAliveRequest{LeaseId: resp.LeaseId, Service: "web", Id: "w-1", Secret: resp.Secret}); err != nil {
			return err
		}
		_, err := ka.Recv()
		return err
	}
	if err := renew(); err != nil {
		t.Fatal(err)
	}
	// web-reg first: the watch ending proves the cache applied the later
	// revoke, so the earlier one too (a watch delivers in order).
	for _, name := range []string{"web-reg", "reader"} {
		if _, err := admin.Tokens().RevokeToken(ctx, &registryv1.RevokeTokenRequest{Name: name}); err != nil {
			t.Fatal(err)
		}
	}
	for {
		_, err := ws.Recv()
		if err == nil {
			continue // the put of w-1, progress
		}
		if status.Code(err) != codes.Unauthenticated || !strings.Contains(err.Error(), "revoked") {
			t.Fatalf("the watch of a revoked token ended with %v", err)
		}
		break
	}
	if err := renew(); status.Code(err) != codes.Unauthenticated {
		t.Fatalf("a renewal with a revoked token: %v", err)
	}
}

// A token that expires while its Watch is open ends it, with no event in
// etcd to say so.
func TestExpiryEndsWatch(t *testing.T) {
	rn, adminTok := authNode(t, peerlimit.Config{})
	admin := as(t, rn, adminTok)
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	resp, err := admin.Tokens().CreateToken(ctx, &registryv1.CreateTokenRequest{Name: "brief", Role: registryv1.TokenRole_TOKEN_ROLE_READ,
		Scope: &registryv1.TokenScope{Kind: registryv1.TokenScope_KIND_ALL}, Ttl: durationpb.New(3 * time.Second)})
	if err != nil {
		t.Fatal(err)
	}
	ws, err := as(t, rn, resp.Secret).API().Watch(ctx, &registryv1.WatchRequest{})
	if err != nil {
		t.Fatal(err)
	}
	for {
		if _, err = ws.Recv(); err != nil {
			break // snapshot and progress until then
		}
	}
	if status.Code(err) != codes.Unauthenticated || !strings.Contains(err.Error(), "expired") {
		t.Fatalf("the watch of an expiring token ended with %v", err)
	}
}
