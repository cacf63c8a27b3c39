package node_test

import (
	"context"
	"fmt"
	"strings"
	"testing"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/credentials/insecure"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/proto"

	"github.com/regcluster/registry/internal/etcdtest"
	"github.com/regcluster/registry/internal/node"
	"github.com/regcluster/registry/internal/regnodetest"
	registryv1 "github.com/regcluster/registry/proto/registry/v1"
)

func apiClient(t *testing.T, addr string) registryv1.RegistryClient {
	t.Helper()
	cc, err := grpc.NewClient(addr, grpc.WithTransportCredentials(insecure.NewCredentials()))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { cc.Close() })
	return registryv1.NewRegistryClient(cc)
}

func etcdRevision(t *testing.T, rn *regnodetest.Regnode) int64 {
	t.Helper()
	resp, err := rn.Etcd.Get(context.Background(), "\x00")
	if err != nil {
		t.Fatal(err)
	}
	return resp.Header.Revision
}

// padded is a valid instance whose metadata holds n values of 1 KiB.
func padded(id string, n int) *registryv1.Instance {
	md := map[string]string{}
	for i := range n {
		md[fmt.Sprintf("k%02d", i)] = strings.Repeat("x", 1024)
	}
	return &registryv1.Instance{Service: "big", Id: id, Address: "10.0.0.1:80", Metadata: md}
}

func TestAPILimitsValidate(t *testing.T) {
	def := node.DefaultConfig()
	if err := def.Validate(); err != nil {
		t.Fatalf("defaults: %v", err)
	}
	for _, tc := range []struct {
		mod  func(*node.Config)
		flag string
	}{
		{func(c *node.Config) { c.MaxRequestBytes = node.MinRequestBytes - 1 }, "Config.MaxRequestBytes"},
		{func(c *node.Config) { c.MaxResponseBytes = node.MinResponseBytes - 1 }, "Config.MaxResponseBytes"},
		{func(c *node.Config) { c.Limits.MaxRegistrations = 0 }, "Config.Limits.MaxRegistrations"},
	} {
		c := node.DefaultConfig()
		tc.mod(&c)
		if err := c.Validate(); err == nil || !strings.Contains(err.Error(), tc.flag) {
			t.Errorf("Validate = %v, want an error naming %s", err, tc.flag)
		}
	}
}

// A request larger than --max-request-bytes is refused by grpc-go with
// ResourceExhausted before the registry decodes it, and writes nothing;
// one under it but over the record's cap is the registry's InvalidArgument.
func TestRequestSizeCapped(t *testing.T) {
	m := etcdtest.Start(t, false)
	rn := regnodetest.StartExternal(t, m.ClientURL)
	api := apiClient(t, rn.Addr)
	ctx := context.Background()

	huge := &registryv1.RegisterRequest{Instance: padded("huge", 64)}
	if size := proto.Size(huge); size <= node.DefaultMaxRequestBytes {
		t.Fatalf("the oversized request is only %d bytes", size)
	}
	rev := etcdRevision(t, rn)
	_, err := api.Register(ctx, huge)
	if status.Code(err) != codes.ResourceExhausted || !strings.Contains(err.Error(), "larger than max") {
		t.Fatalf("a %d-byte Register: %v, want grpc's ResourceExhausted", proto.Size(huge), err)
	}
	if now := etcdRevision(t, rn); now != rev {
		t.Fatalf("an oversized request moved etcd from revision %d to %d", rev, now)
	}
	_, err = api.Register(ctx, &registryv1.RegisterRequest{Instance: padded("big", 20)})
	if status.Code(err) != codes.InvalidArgument || !strings.Contains(err.Error(), "instance") {
		t.Fatalf("a 20 KiB record: %v, want InvalidArgument naming the instance", err)
	}
	if _, err := api.Register(ctx, &registryv1.RegisterRequest{Instance: padded("ok", 14)}); err != nil {
		t.Fatalf("a record under its cap: %v", err)
	}
}

// A List page of about chunk.MaxBytes goes out under the response cap.
func TestFullPageUnderResponseCap(t *testing.T) {
	m := etcdtest.Start(t, false)
	rn := regnodetest.StartExternal(t, m.ClientURL)
	api := apiClient(t, rn.Addr)
	ctx := context.Background()
	for i := range 80 {
		if _, err := api.Register(ctx, &registryv1.RegisterRequest{Instance: padded(fmt.Sprint("p-", i), 14)}); err != nil {
			t.Fatal(err)
		}
	}
	page, err := api.List(ctx, &registryv1.ListRequest{Service: "big", PageSize: 1000})
	if err != nil {
		t.Fatalf("a full page: %v", err)
	}
	if size := proto.Size(page); size < 900<<10 {
		t.Fatalf("the page is %d bytes, want about 1 MiB", size)
	}
}

// Past --max-concurrent-streams on one connection a grpc-go client waits
// for a stream to end (HTTP/2 flow control of streams, not an error from
// the server): the extra Watch never reaches the regnode and ends with its
// own deadline; another connection is not affected; once a stream ends
// the waiting one goes through.
func TestConcurrentStreamsPerConnection(t *testing.T) {
	m := etcdtest.Start(t, false)
	rn := regnodetest.StartWith(t, node.Config{EtcdEndpoints: []string{m.ClientURL}, MaxConcurrentStreams: 2}, m.ClientURL)
	api := apiClient(t, rn.Addr)
	ctx := context.Background()
	open := func(ctx context.Context, c registryv1.RegistryClient) error {
		w, err := c.Watch(ctx, &registryv1.WatchRequest{})
		if err == nil {
			_, err = w.Recv()
		}
		return err
	}
	ctx1, stop1 := context.WithCancel(ctx)
	defer stop1()
	if err := open(ctx1, api); err != nil {
		t.Fatal(err)
	}
	ctx2, stop2 := context.WithCancel(ctx)
	defer stop2()
	if err := open(ctx2, api); err != nil {
		t.Fatal(err)
	}
	waiting, stopW := context.WithTimeout(ctx, 2*time.Second)
	defer stopW()
	if err := open(waiting, api); status.Code(err) != codes.DeadlineExceeded {
		t.Fatalf("a third stream on a connection capped at 2: %v, want it to wait until its deadline", err)
	}
	if n := rn.Node.Hub().Subscribers(); n != 2 {
		t.Fatalf("the regnode serves %d subscribers, want the 2 the cap let through", n)
	}
	ctx3, stop3 := context.WithCancel(ctx)
	defer stop3()
	if err := open(ctx3, apiClient(t, rn.Addr)); err != nil {
		t.Fatalf("a stream on another connection: %v", err)
	}
	stop1()
	ctx4, stop4 := context.WithTimeout(ctx, 30*time.Second)
	defer stop4()
	if err := open(ctx4, api); err != nil {
		t.Fatalf("a stream after one of the connection's ended: %v", err)
	}
}
