package xds_test

import (
	"context"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"

	corev3 "github.com/envoyproxy/go-control-plane/envoy/config/core/v3"
	endpointv3 "github.com/envoyproxy/go-control-plane/envoy/config/endpoint/v3"
	listenerv3 "github.com/envoyproxy/go-control-plane/envoy/config/listener/v3"
	discoverygrpc "github.com/envoyproxy/go-control-plane/envoy/service/discovery/v3"
	resourcev3 "github.com/envoyproxy/go-control-plane/pkg/resource/v3"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/credentials"
	"google.golang.org/grpc/credentials/insecure"
	"google.golang.org/grpc/metadata"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/types/known/anypb"
	"google.golang.org/protobuf/types/known/durationpb"
	"google.golang.org/protobuf/types/known/timestamppb"

	"github.com/regcluster/registry/client"
	"github.com/regcluster/registry/internal/embedded"
	"github.com/regcluster/registry/internal/etcdtest"
	"github.com/regcluster/registry/internal/node"
	"github.com/regcluster/registry/internal/peerlimit"
	"github.com/regcluster/registry/internal/regnodetest"
	"github.com/regcluster/registry/internal/tlsfiles"
	"github.com/regcluster/registry/internal/tlstest"
	registryv1 "github.com/regcluster/registry/proto/registry/v1"
	"github.com/regcluster/registry/store"
)

func adsClient(t *testing.T, addr string) discoverygrpc.AggregatedDiscoveryServiceClient {
	t.Helper()
	cc, err := grpc.NewClient(addr, grpc.WithTransportCredentials(insecure.NewCredentials()))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { cc.Close() })
	return discoverygrpc.NewAggregatedDiscoveryServiceClient(cc)
}

// What an Envoy node is sent (Envoy itself is not installable here), over
// incremental xDS: its assignment has a locality per zone, each endpoint
// with its weight and its status as it is (DEGRADED, DRAINING), nothing of
// UNAVAILABLE; an ACK is taken; a service that does not exist is absent
// and the stream goes on. Over state of the world, a gRPC node asking
// for a listener that exists and one that does not gets the one.
func TestEnvoyNodeResources(t *testing.T) {
	rn := regnodetest.Start(t)
	c, err := client.New(client.Config{Endpoints: []string{rn.Addr}})
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	reg := func(id, addr, zone string, w uint32) {
		t.Helper()
		if _, err := c.API().Register(ctx, &registryv1.RegisterRequest{Ttl: durationpb.New(time.Minute), Instance: &registryv1.Instance{
			Service: "orders", Id: id, Address: addr, Zone: zone, Weight: w}}); err != nil {
			t.Fatal(err)
		}
	}
	reg("a", "10.0.0.1:80", "z1", 200)
	reg("b", "10.0.0.2:80", "z1", 100)
	reg("c", "10.0.0.3:80", "z2", 100)
	reg("d", "10.0.0.4:80", "z2", 100)
	st, err := store.New(store.Config{Client: rn.Etcd, Prefix: rn.Prefix})
	if err != nil {
		t.Fatal(err)
	}
	health := func(id string, h registryv1.HealthState) {
		if _, _, err := st.Update(ctx, "orders", id, func(in *registryv1.Instance) error {
			in.Health = &registryv1.Health{State: h, Since: timestamppb.Now()}
			return nil
		}); err != nil {
			t.Fatal(err)
		}
	}
	health("b", registryv1.HealthState_HEALTH_STATE_DEGRADED)
	health("d", registryv1.HealthState_HEALTH_STATE_UNAVAILABLE)
	dr, err := c.API().Drain(ctx, &registryv1.DrainRequest{Service: "orders", Id: "c"})
	if err != nil {
		t.Fatal(err)
	}
	rn.WaitRevision(t, dr.Revision)

	ads := adsClient(t, rn.Addr)
	ds, err := ads.DeltaAggregatedResources(ctx)
	if err != nil {
		t.Fatal(err)
	}
	envoy := &corev3.Node{Id: "envoy-1", UserAgentName: "envoy"}
	if err := ds.Send(&discoverygrpc.DeltaDiscoveryRequest{Node: envoy, TypeUrl: resourcev3.EndpointType,
		ResourceNamesSubscribe: []string{"orders", "nope"}}); err != nil {
		t.Fatal(err)
	}
	var cla *endpointv3.ClusterLoadAssignment
	for cla == nil || !strings.Contains(cla.String(), "DRAINING") {
		resp, err := ds.Recv()
		if err != nil {
			t.Fatal(err)
		}
		for _, r := range resp.Resources {
			if r.Name == "nope" {
				t.Fatalf("a service that does not exist was sent: %v", r)
			}
			cla = &endpointv3.ClusterLoadAssignment{}
			if err := r.Resource.UnmarshalTo(cla); err != nil {
				t.Fatal(err)
			}
		}
		if err := ds.Send(&discoverygrpc.DeltaDiscoveryRequest{TypeUrl: resourcev3.EndpointType, ResponseNonce: resp.Nonce}); err != nil {
			t.Fatal(err)
		}
	}
	type ep struct {
		zone   string
		status corev3.HealthStatus
		weight uint32
	}
	got := map[string]ep{}
	for _, l := range cla.Endpoints {
		for _, e := range l.LbEndpoints {
			got[e.GetEndpoint().GetHostname()] = ep{l.Locality.GetZone(), e.HealthStatus, e.LoadBalancingWeight.GetValue()}
		}
	}
	want := map[string]ep{
		"a": {"z1", corev3.HealthStatus_HEALTHY, 200},
		"b": {"z1", corev3.HealthStatus_DEGRADED, 25},
		"c": {"z2", corev3.HealthStatus_DRAINING, 100},
	}
	if len(got) != len(want) {
		t.Fatalf("Envoy was sent %v, want %v", got, want)
	}
	for id, w := range want {
		if got[id] != w {
			t.Errorf("Envoy, instance %s: %+v, want %+v", id, got[id], w)
		}
	}
	if len(cla.Endpoints) != 2 || cla.Endpoints[0].LoadBalancingWeight.GetValue() != 225 {
		t.Errorf("Envoy localities: %v, want z1 (weight 225) and z2", cla.Endpoints)
	}

	ss, err := ads.StreamAggregatedResources(ctx)
	if err != nil {
		t.Fatal(err)
	}
	if err := ss.Send(&discoverygrpc.DiscoveryRequest{Node: &corev3.Node{Id: "grpc-1", UserAgentName: "gRPC Go"},
		TypeUrl: resourcev3.ListenerType, ResourceNames: []string{"orders", "nope"}}); err != nil {
		t.Fatal(err)
	}
	resp, err := ss.Recv()
	if err != nil {
		t.Fatal(err)
	}
	if len(resp.Resources) != 1 {
		t.Fatalf("listeners sent: %d, want orders alone", len(resp.Resources))
	}
	l := &listenerv3.Listener{}
	if err := resp.Resources[0].UnmarshalTo(l); err != nil || l.Name != "orders" || l.ApiListener == nil {
		t.Fatalf("listener: %v, %v", l, err)
	}
}

// With --auth an xDS stream needs a token and is served only what the
// token may read: none is Unauthenticated; a token scoped to orders gets
// orders and not payments (absent, as a service that does not exist), and
// a wildcard subscription is refused to it (PermissionDenied); a read-all
// token gets both, by name or by wildcard.
func TestXDSAuth(t *testing.T) {
	m := etcdtest.Start(t, false)
	dir := t.TempDir()
	rn := regnodetest.StartWith(t, node.Config{EtcdEndpoints: []string{m.ClientURL}, Auth: true, Embed: embedded.Config{Dir: dir}}, m.ClientURL)
	b, err := os.ReadFile(filepath.Join(dir, node.AdminTokenFile))
	if err != nil {
		t.Fatal(err)
	}
	admin, err := client.New(client.Config{Endpoints: []string{rn.Addr}, Token: strings.TrimSpace(string(b))})
	if err != nil {
		t.Fatal(err)
	}
	defer admin.Close()
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	var rev int64
	for _, svc := range []string{"orders", "payments"} {
		r, err := admin.API().Register(ctx, &registryv1.RegisterRequest{Ttl: durationpb.New(time.Minute),
			Instance: &registryv1.Instance{Service: svc, Id: "i0", Address: "10.0.0.1:80"}})
		if err != nil {
			t.Fatal(err)
		}
		rev = r.Revision
	}
	rn.WaitRevision(t, rev)
	mk := func(name string, kind registryv1.TokenScope_Kind, value string) string {
		r, err := admin.Tokens().CreateToken(ctx, &registryv1.CreateTokenRequest{Name: name, Role: registryv1.TokenRole_TOKEN_ROLE_READ,
			Scope: &registryv1.TokenScope{Kind: kind, Value: value}})
		if err != nil {
			t.Fatal(err)
		}
		return r.Secret
	}
	all, one := mk("xds-all", registryv1.TokenScope_KIND_ALL, ""), mk("xds-one", registryv1.TokenScope_KIND_SERVICE, "orders")
	ads := adsClient(t, rn.Addr)
	// listeners asks for listeners by name (none: a wildcard) and returns
	// the names served, waiting until the regnode's xDS view has both.
	listeners := func(tok string, names ...string) ([]string, error) {
		sctx := ctx
		if tok != "" {
			sctx = metadata.AppendToOutgoingContext(ctx, "authorization", "Bearer "+tok)
		}
		s, err := ads.StreamAggregatedResources(sctx)
		if err != nil {
			return nil, err
		}
		// A refused stream may end before the request is sent (EOF); its
		// status comes from Recv either way.
		_ = s.Send(&discoverygrpc.DiscoveryRequest{Node: &corev3.Node{Id: "n"}, TypeUrl: resourcev3.ListenerType, ResourceNames: names})
		resp, err := s.Recv()
		if err != nil {
			return nil, err
		}
		var got []string
		for _, a := range resp.Resources {
			l := &listenerv3.Listener{}
			if err := a.UnmarshalTo(l); err != nil {
				return nil, err
			}
			got = append(got, l.Name)
		}
		slices.Sort(got)
		return got, nil
	}
	if _, err := listeners("", "orders"); status.Code(err) != codes.Unauthenticated {
		t.Errorf("no token: %v, want Unauthenticated", err)
	}
	waitFor(t, 30*time.Second, "the xDS view of both services", func() bool {
		got, err := listeners(all)
		return err == nil && slices.Equal(got, []string{"orders", "payments"})
	})
	if got, err := listeners(all, "orders", "payments"); err != nil || !slices.Equal(got, []string{"orders", "payments"}) {
		t.Errorf("read-all token by name: %v, %v", got, err)
	}
	if got, err := listeners(one, "orders", "payments"); err != nil || !slices.Equal(got, []string{"orders"}) {
		t.Errorf("token scoped to orders, asking for orders and payments: %v, %v; want orders alone", got, err)
	}
	if got, err := listeners(one, "payments"); err != nil || len(got) != 0 {
		t.Errorf("token scoped to orders, asking for payments alone: %v, %v; want nothing", got, err)
	}
	if _, err := listeners(one); status.Code(err) != codes.PermissionDenied {
		t.Errorf("token scoped to orders, wildcard: %v, want PermissionDenied", err)
	}

	// Assignments asked for with no names at first are no wildcard (only
	// listeners and clusters have one): a scoped client that then names
	// orders is sent orders, never payments, over either protocol.
	sctx := metadata.AppendToOutgoingContext(ctx, "authorization", "Bearer "+one)
	assignments := func(as []*anypb.Any) []string {
		var got []string
		for _, a := range as {
			cla := &endpointv3.ClusterLoadAssignment{}
			if err := a.UnmarshalTo(cla); err != nil {
				t.Fatal(err)
			}
			got = append(got, cla.ClusterName)
		}
		slices.Sort(got)
		return got
	}
	ds, err := ads.DeltaAggregatedResources(sctx)
	if err != nil {
		t.Fatal(err)
	}
	for _, names := range [][]string{nil, {"orders"}} {
		if err := ds.Send(&discoverygrpc.DeltaDiscoveryRequest{Node: &corev3.Node{Id: "n", UserAgentName: "envoy"},
			TypeUrl: resourcev3.EndpointType, ResourceNamesSubscribe: names}); err != nil {
			t.Fatal(err)
		}
	}
	dr, err := ds.Recv()
	if err != nil {
		t.Fatal(err)
	}
	var delta []*anypb.Any
	for _, r := range dr.Resources {
		delta = append(delta, r.Resource)
	}
	if got := assignments(delta); !slices.Equal(got, []string{"orders"}) {
		t.Errorf("delta, token scoped to orders, no names then orders: first response %v, want orders alone", got)
	}
	ss, err := ads.StreamAggregatedResources(sctx)
	if err != nil {
		t.Fatal(err)
	}
	if err := ss.Send(&discoverygrpc.DiscoveryRequest{Node: &corev3.Node{Id: "n"}, TypeUrl: resourcev3.EndpointType}); err != nil {
		t.Fatal(err)
	}
	for {
		sr, err := ss.Recv()
		if err != nil {
			t.Fatal(err)
		}
		got := assignments(sr.Resources)
		if len(got) > 0 {
			if !slices.Equal(got, []string{"orders"}) {
				t.Errorf("sotw, token scoped to orders, no names then orders: %v, want orders alone", got)
			}
			break
		}
		if err := ss.Send(&discoverygrpc.DiscoveryRequest{TypeUrl: resourcev3.EndpointType, ResourceNames: []string{"orders"},
			VersionInfo: sr.VersionInfo, ResponseNonce: sr.Nonce}); err != nil {
			t.Fatal(err)
		}
	}
}

// xDS streams count against a caller's stream cap as every other stream
// does: past it a stream is refused with ResourceExhausted, and one
// closed makes room.
func TestXDSStreamsCapped(t *testing.T) {
	m := etcdtest.Start(t, false)
	limits := peerlimit.DefaultConfig()
	limits.MaxStreams = 2
	rn := regnodetest.StartWith(t, node.Config{EtcdEndpoints: []string{m.ClientURL}, Limits: limits}, m.ClientURL)
	ads := adsClient(t, rn.Addr)
	open := func() (context.CancelFunc, error) {
		ctx, cancel := context.WithCancel(context.Background())
		s, err := ads.StreamAggregatedResources(ctx)
		if err == nil {
			// A refused stream may end before the request is sent (EOF);
			// its status comes from Recv either way.
			_ = s.Send(&discoverygrpc.DiscoveryRequest{Node: &corev3.Node{Id: "n"}, TypeUrl: resourcev3.ListenerType})
			_, err = s.Recv()
		}
		return cancel, err
	}
	var held []context.CancelFunc
	defer func() {
		for _, c := range held {
			c()
		}
	}()
	for i := range 2 {
		cancel, err := open()
		if err != nil {
			t.Fatalf("stream %d: %v", i+1, err)
		}
		held = append(held, cancel)
	}
	cancel, err := open()
	cancel()
	if status.Code(err) != codes.ResourceExhausted {
		t.Fatalf("a third stream: %v, want ResourceExhausted", err)
	}
	held[0]()
	held = held[1:]
	waitFor(t, 30*time.Second, "room for a stream once one closed", func() bool {
		cancel, err := open()
		if err == nil {
			held = append(held, cancel)
			return true
		}
		cancel()
		return false
	})
}

// Versions never repeat across regnodes (nor restarts: the prefix is
// random per process): a client that moves to another regnode with the
// version it had is sent the whole state again, never told it is
// current by a version that only looks the same.
func TestXDSVersionsDifferAcrossRegnodes(t *testing.T) {
	m := etcdtest.Start(t, false)
	a := regnodetest.StartExternal(t, m.ClientURL)
	b := regnodetest.StartExternal(t, m.ClientURL)
	c, err := client.New(client.Config{Endpoints: []string{a.Addr}})
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	r, err := c.API().Register(ctx, &registryv1.RegisterRequest{Ttl: durationpb.New(time.Minute),
		Instance: &registryv1.Instance{Service: "orders", Id: "i0", Address: "10.0.0.1:80"}})
	if err != nil {
		t.Fatal(err)
	}
	a.WaitRevision(t, r.Revision)
	b.WaitRevision(t, r.Revision)
	version := func(addr string) string {
		s, err := adsClient(t, addr).StreamAggregatedResources(ctx)
		if err != nil {
			t.Fatal(err)
		}
		for {
			_ = s.Send(&discoverygrpc.DiscoveryRequest{Node: &corev3.Node{Id: "n"}, TypeUrl: resourcev3.EndpointType, ResourceNames: []string{"orders"}})
			resp, err := s.Recv()
			if err != nil {
				t.Fatal(err)
			}
			if len(resp.Resources) == 1 {
				return resp.VersionInfo
			}
		}
	}
	va, vb := version(a.Addr), version(b.Addr)
	if va == "" || va == vb {
		t.Fatalf("versions of two regnodes for the same view: %q and %q, want different", va, vb)
	}
}

// With --auth and --client-cert-auth an xDS client may be identified by
// its verified client certificate alone (gRPC bootstraps carry no token
// in most languages): it gets the scope of the token named like the
// certificate's common name, and a certificate that names no token is
// Unauthenticated.
func TestXDSClientCertificateIdentity(t *testing.T) {
	ca, clients := tlstest.NewCA(t, "regnode-ca"), tlstest.NewCA(t, "client-ca")
	srv := ca.Server(t, "regnode")
	adminCert, alice, bob := clients.Client(t, "admin"), clients.Client(t, "alice"), clients.Client(t, "bob")
	m := etcdtest.Start(t, false)
	dir := t.TempDir()
	rn := regnodetest.StartWith(t, node.Config{EtcdEndpoints: []string{m.ClientURL}, Auth: true, Embed: embedded.Config{Dir: dir},
		TLS: tlsfiles.Server{CertFile: srv.CertFile, KeyFile: srv.KeyFile, TrustedCAFile: clients.CertFile, ClientCertAuth: true}}, m.ClientURL)
	b, err := os.ReadFile(filepath.Join(dir, node.AdminTokenFile))
	if err != nil {
		t.Fatal(err)
	}
	admin, err := client.New(client.Config{Endpoints: []string{rn.Addr}, Token: strings.TrimSpace(string(b)),
		TLS: tlstest.ClientConfig(t, ca, &adminCert)})
	if err != nil {
		t.Fatal(err)
	}
	defer admin.Close()
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	for _, svc := range []string{"orders", "payments"} {
		if _, err := admin.API().Register(ctx, &registryv1.RegisterRequest{Ttl: durationpb.New(time.Minute),
			Instance: &registryv1.Instance{Service: svc, Id: "i0", Address: "10.0.0.1:80"}}); err != nil {
			t.Fatal(err)
		}
	}
	if _, err := admin.Tokens().CreateToken(ctx, &registryv1.CreateTokenRequest{Name: "alice", Role: registryv1.TokenRole_TOKEN_ROLE_READ,
		Scope: &registryv1.TokenScope{Kind: registryv1.TokenScope_KIND_SERVICE, Value: "orders"}}); err != nil {
		t.Fatal(err)
	}
	listeners := func(cert tlstest.Files) ([]string, error) {
		cc, err := grpc.NewClient(rn.Addr, grpc.WithTransportCredentials(credentials.NewTLS(tlstest.ClientConfig(t, ca, &cert))))
		if err != nil {
			t.Fatal(err)
		}
		defer cc.Close()
		s, err := discoverygrpc.NewAggregatedDiscoveryServiceClient(cc).StreamAggregatedResources(ctx)
		if err != nil {
			return nil, err
		}
		_ = s.Send(&discoverygrpc.DiscoveryRequest{Node: &corev3.Node{Id: "n"}, TypeUrl: resourcev3.ListenerType, ResourceNames: []string{"orders", "payments"}})
		resp, err := s.Recv()
		if err != nil {
			return nil, err
		}
		var got []string
		for _, a := range resp.Resources {
			l := &listenerv3.Listener{}
			if err := a.UnmarshalTo(l); err != nil {
				return nil, err
			}
			got = append(got, l.Name)
		}
		return got, nil
	}
	waitFor(t, 30*time.Second, "alice's certificate served orders alone", func() bool {
		got, err := listeners(alice)
		if err != nil {
			t.Fatalf("alice's certificate: %v", err)
		}
		return slices.Equal(got, []string{"orders"})
	})
	if _, err := listeners(bob); status.Code(err) != codes.Unauthenticated || !strings.Contains(err.Error(), `no token is named "bob"`) {
		t.Fatalf("a certificate that names no token: %v, want Unauthenticated naming it", err)
	}
}
