package record

import (
	"errors"
	"net"
	"strings"
	"testing"
	"time"
	"unicode"

	"google.golang.org/protobuf/proto"
	"google.golang.org/protobuf/types/known/durationpb"

	registryv1 "github.com/regcluster/registry/proto/registry/v1"
)

// The fuzz targets below hold the package's contract on any input: Decode
// never panics and returns only records Validate accepts, whatever a
// writer put in etcd; what Validate accepts every reader decodes back to
// the same record; a refusal is always a *FieldError naming a field.
// Their seeds are in testdata/fuzz/<FuzzName>/ (run by plain go test);
// `make fuzz` runs each for a bounded time.

// FuzzDecode feeds Decode arbitrary keys and values, as etcdctl could.
func FuzzDecode(f *testing.F) {
	k := NewKeys("")
	good, err := Encode(valid())
	if err != nil {
		f.Fatal(err)
	}
	f.Add(k.Instance("orders", "o-1"), good)
	f.Add(k.Instance("orders", "o-1"), []byte{})
	f.Add(k.Instance("orders", "o-2"), good)
	f.Add("/registry/v1/instances/orders/o-1/x", good)
	f.Fuzz(func(t *testing.T, key string, value []byte) {
		inst, err := k.Decode(key, value, 5, 6)
		if err != nil {
			if inst != nil || !errors.Is(err, ErrJunk) {
				t.Fatalf("Decode = %v, %v: an error that is not ErrJunk, or a record with it", inst, err)
			}
			return
		}
		if err := Validate(inst); err != nil {
			t.Fatalf("Decode returned a record Validate refuses: %v", err)
		}
		service, id, _ := k.Parse(key)
		if inst.Service != service || inst.Id != id || inst.CreateRevision != 5 || inst.ModRevision != 6 {
			t.Fatalf("Decode(%q) = %s/%s at %d/%d", key, inst.Service, inst.Id, inst.CreateRevision, inst.ModRevision)
		}
		b, err := Encode(inst)
		if err != nil {
			t.Fatalf("a decoded record does not encode: %v", err)
		}
		again, err := k.Decode(key, b, 5, 6)
		if err != nil || !proto.Equal(again, inst) {
			t.Fatalf("re-encoded record decodes to %v, %v; want %v", again, err, inst)
		}
	})
}

// FuzzValidate builds instances from arbitrary field values.
func FuzzValidate(f *testing.F) {
	f.Add("orders", "o-1", "10.0.0.1:8080", "eu-1a", "1.2.3", uint32(100), "team", "core", "kernel upgrade",
		int32(2), "/healthz", int64(time.Second), int64(500*time.Millisecond), int32(2))
	f.Add("orders", "o-1", "evil\nhost:80", "eu 1", "", uint32(0), "a\x01", "\xff", "a\nb",
		int32(0), "/x", int64(0), int64(1), int32(9))
	f.Add("a", "..", "[::1]:0080", "\u00a0", "v", uint32(1001), "", "", "",
		int32(1), "", int64(-1), int64(time.Hour), int32(3))
	f.Fuzz(func(t *testing.T, service, id, address, zone, version string, weight uint32,
		mk, mv, reason string, kind int32, target string, interval, timeout int64, lifecycle int32) {
		in := &registryv1.Instance{
			Service: service, Id: id, Address: address, Zone: zone, Version: version, Weight: weight,
			Metadata: map[string]string{mk: mv}, LifecycleReason: reason, Lifecycle: registryv1.Lifecycle(lifecycle),
			Check: &registryv1.HealthCheck{Kind: registryv1.CheckKind(kind), Target: target,
				Interval: durationpb.New(time.Duration(interval)), Timeout: durationpb.New(time.Duration(timeout))},
		}
		err := Validate(in)
		if err != nil {
			var fe *FieldError
			if !errors.As(err, &fe) || fe.Field == "" || fe.Reason == "" || !errors.Is(err, ErrInvalid) {
				t.Fatalf("Validate = %#v: not a FieldError naming a field", err)
			}
			if strings.ContainsFunc(err.Error(), unicode.IsControl) {
				t.Fatalf("refusal %q carries a control character", err)
			}
			return
		}
		// Accepted: the rules that must hold, held.
		for _, s := range []string{zone, version, mk} {
			if strings.ContainsFunc(s, unicode.IsSpace) || strings.ContainsFunc(s, unicode.IsControl) {
				t.Fatalf("accepted the name %q", s)
			}
		}
		if strings.ContainsFunc(mv, unicode.IsControl) || strings.ContainsFunc(reason, unicode.IsControl) {
			t.Fatalf("accepted control characters in %q or %q", mv, reason)
		}
		if weight > MaxWeight {
			t.Fatalf("accepted weight %d", weight)
		}
		if d := in.Check.Timeout.AsDuration(); d != 0 && d < MinCheckTimeout {
			t.Fatalf("accepted timeout %s", d)
		}
		if in.Check.Kind == registryv1.CheckKind_CHECK_KIND_NONE && target != "" {
			t.Fatalf("accepted NONE with target %q", target)
		}
		k := NewKeys("")
		b, err := Encode(in)
		if err != nil {
			t.Fatalf("Validate accepted an instance that does not encode: %v", err)
		}
		out, err := k.Decode(k.Instance(service, id), b, 1, 1)
		if err != nil {
			t.Fatalf("Validate accepted an instance readers refuse: %v", err)
		}
		out.CreateRevision, out.ModRevision = 0, 0
		if !proto.Equal(out, in) {
			t.Fatalf("decoded %v, want %v", out, in)
		}
	})
}

// FuzzValidAddress holds the address rules on any string.
func FuzzValidAddress(f *testing.F) {
	for _, s := range []string{"10.0.0.1:80", "[::1]:7400", "node-2.example.com.:65535", "300.1.1.1:80",
		"10.0.0.1:+80", "10.0.0.1:0080", "a b c:80", "evil\nhost:80", "[10.0.0.1]:80", "h:99999"} {
		f.Add(s)
	}
	f.Fuzz(func(t *testing.T, address string) {
		err := ValidAddress(address)
		if err != nil {
			var fe *FieldError
			if !errors.As(err, &fe) || fe.Field != "address" {
				t.Fatalf("ValidAddress = %v: not a FieldError naming the address", err)
			}
			return
		}
		host, port, err := net.SplitHostPort(address)
		if err != nil || net.JoinHostPort(host, port) != address {
			t.Fatalf("accepted %q, which is not host:port in canonical form", address)
		}
		if strings.ContainsFunc(host, func(r rune) bool { return r > unicode.MaxASCII || !unicode.IsPrint(r) || r == ' ' }) {
			t.Fatalf("accepted the host %q", host)
		}
		if port[0] == '0' || len(port) > 5 || strings.Trim(port, "0123456789") != "" {
			t.Fatalf("accepted the port %q", port)
		}
		if ip := net.ParseIP(host); ip == nil && strings.Trim(strings.ReplaceAll(host, ".", ""), "0123456789") == "" {
			t.Fatalf("accepted %q, all digits and not an IP address", host)
		}
	})
}

// FuzzUnmarshal feeds Unmarshal arbitrary bytes as a Register request, as
// a hostile gRPC client could.
func FuzzUnmarshal(f *testing.F) {
	good, err := proto.Marshal(&registryv1.RegisterRequest{Instance: valid(), Ttl: durationpb.New(10 * time.Second)})
	if err != nil {
		f.Fatal(err)
	}
	f.Add(good)
	f.Add(good[:len(good)/2])
	f.Add([]byte{0x0a, 0x03, 0x1a, 0x01, 0xff})
	f.Fuzz(func(t *testing.T, b []byte) {
		var m registryv1.RegisterRequest
		err := Unmarshal(b, &m, "request")
		protoErr := proto.Unmarshal(b, &registryv1.RegisterRequest{})
		if (err == nil) != (protoErr == nil) {
			t.Fatalf("Unmarshal = %v but proto.Unmarshal = %v", err, protoErr)
		}
		if err == nil {
			return
		}
		var fe *FieldError
		if !errors.As(err, &fe) || fe.Field == "" || fe.Reason == "" {
			t.Fatalf("Unmarshal = %#v: not a FieldError naming a field", err)
		}
		if !proto.Equal(&m, &registryv1.RegisterRequest{}) {
			t.Fatalf("a refused message was left half-decoded: %v", &m)
		}
	})
}
