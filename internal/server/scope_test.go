package server_test

import (
	"context"
	"net"
	"strings"
	"testing"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	healthgrpc "google.golang.org/grpc/health"
	healthpb "google.golang.org/grpc/health/grpc_health_v1"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/types/known/durationpb"

	"github.com/regcluster/registry/client"
	"github.com/regcluster/registry/internal/peerlimit"
	registryv1 "github.com/regcluster/registry/proto/registry/v1"
)

// A Client whose token may read payments but not orders: the refused
// service ends alone (its SubscribeError), the stream goes on carrying
// payments, a payments channel is served, and an orders channel's first
// call fails at once with the refusal (not "registry not reached" after
// the connect timeout, and never a wait that cannot end).
func TestOutOfScopeServiceEndsAlone(t *testing.T) {
	rn, adminTok := authNode(t, peerlimit.Config{})
	admin := as(t, rn, adminTok)
	lis, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	srv := grpc.NewServer()
	healthpb.RegisterHealthServer(srv, healthgrpc.NewServer())
	go srv.Serve(lis)
	t.Cleanup(srv.Stop)
	for _, svc := range []string{"payments", "orders"} {
		if _, err := admin.API().Register(ctx10(t), &registryv1.RegisterRequest{Ttl: durationpb.New(time.Minute),
			Instance: &registryv1.Instance{Service: svc, Id: "i0", Address: lis.Addr().String()}}); err != nil {
			t.Fatal(err)
		}
	}
	tok := mkToken(t, admin, "payments-reader", registryv1.TokenRole_TOKEN_ROLE_READ, registryv1.TokenScope_KIND_SERVICE, "payments")
	c := as(t, rn, tok)
	orders, err := c.Subscribe(context.Background(), "orders", client.SubscribeOptions{})
	if err != nil {
		t.Fatal(err)
	}
	defer orders.Close()
	payments, err := c.Subscribe(context.Background(), "payments", client.SubscribeOptions{})
	if err != nil {
		t.Fatal(err)
	}
	defer payments.Close()
	if err := payments.WaitReady(ctx10(t)); err != nil {
		t.Fatalf("payments, beside a refused service on the same stream: %v", err)
	}
	// Its view holds the instance (the first snapshot may predate the
	// registration: the fan-out follows etcd a moment behind).
	for deadline := time.Now().Add(30 * time.Second); len(payments.Instances("payments")) != 1; time.Sleep(10 * time.Millisecond) {
		if time.Now().After(deadline) {
			t.Fatalf("payments' view never held its instance: %v", payments.Instances("payments"))
		}
	}
	call := func(service string) error {
		cc, err := grpc.NewClient("registry:///"+service, c.DialOptions()...)
		if err != nil {
			t.Fatal(err)
		}
		defer cc.Close()
		_, err = healthpb.NewHealthClient(cc).Check(ctx10(t), &healthpb.HealthCheckRequest{})
		return err
	}
	if err := call("payments"); err != nil {
		t.Fatalf("payments call: %v", err)
	}
	err = call("orders")
	if status.Code(err) != codes.Unavailable || !strings.Contains(err.Error(), "orders: the registry refused to follow it") ||
		!strings.Contains(err.Error(), "payments-reader") {
		t.Fatalf("orders call: %v, want the refusal", err)
	}
	if f := orders.Freshness(); f.Known || status.Code(f.Err) != codes.PermissionDenied {
		t.Fatalf("orders' freshness %+v, want unknown and PermissionDenied", f)
	}
	if st := payments.Stats(); st.Reconnects != 0 {
		t.Fatalf("the stream was restarted %d times by the refused service", st.Reconnects)
	}
}
