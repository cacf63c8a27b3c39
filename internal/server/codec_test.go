package server_test

import (
	"context"
	"errors"
	"strings"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus/testutil"
	"google.golang.org/genproto/googleapis/rpc/errdetails"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/credentials/insecure"
	"google.golang.org/grpc/mem"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/encoding/protowire"
	"google.golang.org/protobuf/types/known/durationpb"

	"github.com/regcluster/registry/client"
	"github.com/regcluster/registry/internal/regnodetest"
	registryv1 "github.com/regcluster/registry/proto/registry/v1"
	"github.com/regcluster/registry/record"
)

// rawCodec sends []byte as they are: how a test plays a client whose
// protobuf is broken.
type rawCodec struct{}

func (rawCodec) Name() string { return "proto" }
func (rawCodec) Marshal(v any) (mem.BufferSlice, error) {
	return mem.BufferSlice{mem.SliceBuffer(v.([]byte))}, nil
}
func (rawCodec) Unmarshal(data mem.BufferSlice, v any) error {
	*(v.(*[]byte)) = data.Materialize()
	return nil
}

func field(num protowire.Number, payload []byte) []byte {
	return protowire.AppendBytes(protowire.AppendTag(nil, num, protowire.BytesType), payload)
}

func cat(bs ...[]byte) []byte {
	var out []byte
	for _, b := range bs {
		out = append(out, b...)
	}
	return out
}

// wantField checks err is InvalidArgument naming field in its message and
// as errdetails.BadRequest, and that client.FromStatus rebuilds the
// *record.FieldError from it.
func wantField(t *testing.T, err error, field string) {
	t.Helper()
	st := status.Convert(err)
	if st.Code() != codes.InvalidArgument || !strings.HasPrefix(st.Message(), "invalid "+field+": ") {
		t.Fatalf("got %v, want InvalidArgument naming %q", err, field)
	}
	var br *errdetails.BadRequest
	for _, d := range st.Details() {
		if b, ok := d.(*errdetails.BadRequest); ok {
			br = b
		}
	}
	if br == nil || len(br.FieldViolations) != 1 || br.FieldViolations[0].Field != field || br.FieldViolations[0].Description == "" {
		t.Fatalf("details %v, want one BadRequest violation of %q", st.Details(), field)
	}
	var fe *record.FieldError
	cerr := client.FromStatus(err)
	if !errors.As(cerr, &fe) || fe.Field != field || fe.Reason != br.FieldViolations[0].Description ||
		!errors.Is(cerr, record.ErrInvalid) || cerr.Error() != err.Error() {
		t.Fatalf("client.FromStatus(%v) = %v (field %+v): want a *record.FieldError of %q", err, cerr, fe, field)
	}
	if status.Code(cerr) != codes.InvalidArgument {
		t.Fatalf("client.FromStatus hid the status: %v", status.Code(cerr))
	}
}

// Requests that are not valid protobuf, or carry strings that are not
// UTF-8, are refused with InvalidArgument naming the field, on every kind
// of RPC (unary, server stream, bidirectional stream, and the services
// regnode serves besides its own), and nothing is written to etcd.
func TestMalformedRequestsNameTheField(t *testing.T) {
	rn := regnodetest.Start(t)
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	cc, err := grpc.NewClient(rn.Addr, grpc.WithTransportCredentials(insecure.NewCredentials()))
	if err != nil {
		t.Fatal(err)
	}
	defer cc.Close()
	api := newClient(t, rn.Addr).API()
	// The regnode's own prober election writes a key under a lease: wait
	// for it, then take etcd's revision and leases as the baseline.
	waitFor(t, 10*time.Second, "the prober election", func() bool {
		st, err := api.Status(ctx, &registryv1.StatusRequest{})
		return err == nil && st.Leader != ""
	})
	before, err := rn.Etcd.Get(ctx, "x")
	if err != nil {
		t.Fatal(err)
	}
	leasesBefore, err := rn.Etcd.Leases(ctx)
	if err != nil {
		t.Fatal(err)
	}

	instance := func(fields ...[]byte) []byte {
		return field(1, cat(append([][]byte{field(1, []byte("orders")), field(2, []byte("o-1"))}, fields...)...))
	}
	overflow := protowire.AppendTag(nil, 1, protowire.VarintType)
	overflow = append(overflow, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0x01)
	const register = "/registry.v1.Registry/Register"
	unary := []struct {
		name, method string
		req          []byte
		field        string
	}{
		{"address not UTF-8", register, instance(field(3, []byte("10.0.0.1\xff:80"))), "instance.address"},
		{"metadata key not UTF-8", register, instance(field(3, []byte("10.0.0.1:80")), field(7, cat(field(1, []byte("\xc3")), field(2, []byte("v"))))), "instance.metadata"},
		{"check target not UTF-8", register, instance(field(8, field(2, []byte("/\xff")))), "instance.check.target"},
		{"instance truncated", register, []byte{0x0a, 0x40, 0x0a}, "instance"},
		{"field number 0", register, []byte{0x02, 0x00}, "request"},
		{"ttl overflows", register, cat(instance(field(3, []byte("10.0.0.1:80"))), field(2, overflow)), "ttl.seconds"},
		{"drain reason not UTF-8", "/registry.v1.Registry/Drain", cat(field(1, []byte("orders")), field(2, []byte("o-1")), field(3, []byte("bye\xff"))), "reason"},
		{"get service not UTF-8", "/registry.v1.Registry/Get", field(1, []byte("\xffrders")), "service"},
		{"deregister lease overflows", "/registry.v1.Registry/Deregister", cat(field(1, []byte("orders")), field(2, []byte("o-1")), []byte{0x18, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0x01}), "lease_id"},
		{"health service not UTF-8", "/grpc.health.v1.Health/Check", field(1, []byte("\xff")), "service"},
	}
	for _, tc := range unary {
		t.Run(tc.name, func(t *testing.T) {
			var reply []byte
			err := cc.Invoke(ctx, tc.method, tc.req, &reply, grpc.ForceCodecV2(rawCodec{}))
			wantField(t, err, tc.field)
		})
	}

	// A server stream: the request is refused before the handler runs.
	t.Run("watch service not UTF-8", func(t *testing.T) {
		s, err := cc.NewStream(ctx, &grpc.StreamDesc{ServerStreams: true}, "/registry.v1.Registry/Watch", grpc.ForceCodecV2(rawCodec{}))
		if err != nil {
			t.Fatal(err)
		}
		if err := s.SendMsg(field(1, []byte("orders\xff"))); err != nil {
			t.Fatal(err)
		}
		if err := s.CloseSend(); err != nil {
			t.Fatal(err)
		}
		var reply []byte
		wantField(t, s.RecvMsg(&reply), "service")
	})
	// A bidirectional stream: a malformed message in the middle ends it.
	t.Run("keepalive lease overflows", func(t *testing.T) {
		s, err := cc.NewStream(ctx, &grpc.StreamDesc{ServerStreams: true, ClientStreams: true}, "/registry.v1.Registry/KeepAlive", grpc.ForceCodecV2(rawCodec{}))
		if err != nil {
			t.Fatal(err)
		}
		defer s.CloseSend()
		if err := s.SendMsg([]byte{0x08, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0x01}); err != nil {
			t.Fatal(err)
		}
		var reply []byte
		wantField(t, s.RecvMsg(&reply), "lease_id")
	})

	// Well-formed requests the rules refuse carry their field the same way.
	valid := func(change func(*registryv1.Instance)) *registryv1.RegisterRequest {
		in := &registryv1.Instance{Service: "orders", Id: "o-1", Address: "10.0.0.1:8080"}
		change(in)
		return &registryv1.RegisterRequest{Instance: in}
	}
	refused := []struct {
		name  string
		req   *registryv1.RegisterRequest
		field string
	}{
		{"newline in host", valid(func(i *registryv1.Instance) { i.Address = "evil\nhost:80" }), "address"},
		{"octet 300", valid(func(i *registryv1.Instance) { i.Address = "300.1.1.1:80" }), "address"},
		{"port with +", valid(func(i *registryv1.Instance) { i.Address = "10.0.0.1:+80" }), "address"},
		{"zone with a control character", valid(func(i *registryv1.Instance) { i.Zone = "eu\x07" }), "zone"},
		{"NONE with a target", valid(func(i *registryv1.Instance) {
			i.Check = &registryv1.HealthCheck{Kind: registryv1.CheckKind_CHECK_KIND_NONE, Target: "/x"}
		}), "check.target"},
		{"timeout of 1ns", valid(func(i *registryv1.Instance) {
			i.Check = &registryv1.HealthCheck{Kind: registryv1.CheckKind_CHECK_KIND_TCP, Timeout: durationpb.New(1)}
		}), "check.timeout"},
	}
	for _, tc := range refused {
		t.Run(tc.name, func(t *testing.T) {
			_, err := api.Register(ctx, tc.req)
			wantField(t, err, tc.field)
		})
	}

	after, err := rn.Etcd.Get(ctx, "x")
	if err != nil || after.Header.Revision != before.Header.Revision {
		t.Fatalf("etcd moved from revision %d to %d on refused input (%v)", before.Header.Revision, after.Header.Revision, err)
	}
	leases, err := rn.Etcd.Leases(ctx)
	if err != nil || len(leases.Leases) != len(leasesBefore.Leases) {
		t.Fatalf("refused input granted leases: %v, before %v (%v)", leases.Leases, leasesBefore.Leases, err)
	}
	// The refusals are counted like any other call's.
	wantCount := 0
	for _, tc := range unary {
		if tc.method == register {
			wantCount++
		}
	}
	wantCount += len(refused)
	if got := testutil.ToFloat64(rn.Node.Metrics().Requests.WithLabelValues(register, "InvalidArgument")); got != float64(wantCount) {
		t.Fatalf("InvalidArgument registers counted %v, want %d", got, wantCount)
	}
	// And the server decodes good requests as before: the same connection
	// registers, and etcd moves.
	if _, err := api.Register(ctx, valid(func(*registryv1.Instance) {})); err != nil {
		t.Fatal(err)
	}
	if now, err := rn.Etcd.Get(ctx, "x"); err != nil || now.Header.Revision == before.Header.Revision {
		t.Fatalf("a valid register did not write (%v)", err)
	}
}
