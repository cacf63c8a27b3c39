package record

import (
	"errors"
	"strings"
	"testing"

	"google.golang.org/protobuf/encoding/protowire"
	"google.golang.org/protobuf/proto"

	registryv1 "github.com/regcluster/registry/proto/registry/v1"
)

func TestKeys(t *testing.T) {
	k := NewKeys("/r")
	if k.Prefix() != "/r/" || NewKeys("").Prefix() != DefaultPrefix {
		t.Fatalf("prefixes %q, %q", k.Prefix(), NewKeys("").Prefix())
	}
	if got := k.Instance("orders", "o-1"); got != "/r/instances/orders/o-1" {
		t.Fatalf("Instance = %q", got)
	}
	if got := k.Election(); got != "/r/election/prober" {
		t.Fatalf("Election = %q", got)
	}
	for key, want := range map[string]bool{
		"/r/instances/orders/o-1": true,
		"/r/instances/orders/":    false, "/r/instances//o-1": false, "/r/instances/orders": false,
		"/r/instances/orders/o/1": false, "/x/instances/orders/o-1": false, "/r/election/prober": false,
	} {
		s, id, ok := k.Parse(key)
		if ok != want || ok && (s != "orders" || id != "o-1") {
			t.Errorf("Parse(%q) = %q, %q, %v; want ok %v", key, s, id, ok, want)
		}
	}
}

func TestEncodeDecode(t *testing.T) {
	k := NewKeys("")
	in := valid()
	in.ModRevision, in.CreateRevision, in.LeaseId = 9, 8, 77
	b, err := Encode(in)
	if err != nil {
		t.Fatal(err)
	}
	got, err := k.Decode(k.Instance("orders", "o-1"), b, 3, 4)
	if err != nil {
		t.Fatal(err)
	}
	// etcd's revisions come from etcd, never from the value.
	if got.CreateRevision != 3 || got.ModRevision != 4 {
		t.Fatalf("revisions %d, %d; want 3, 4", got.CreateRevision, got.ModRevision)
	}
	got.CreateRevision, got.ModRevision = in.CreateRevision, in.ModRevision
	if !proto.Equal(got, in) {
		t.Fatalf("decoded %v, want %v", got, in)
	}
	again, err := Encode(in)
	if err != nil || string(again) != string(b) {
		t.Fatalf("Encode is not deterministic: %v", err)
	}
	// etcd holds the revisions: the value does not.
	var raw registryv1.Instance
	if err := proto.Unmarshal(b, &raw); err != nil || raw.ModRevision != 0 || raw.CreateRevision != 0 || raw.LeaseId != 77 {
		t.Fatalf("stored form %v (%v): want no revisions, the rest kept", &raw, err)
	}
	// Deterministic: the same bytes every time, whatever the map order.
	in.Metadata = meta(32, 0, 3)
	first, err := Encode(in)
	if err != nil {
		t.Fatal(err)
	}
	for range 20 {
		if b, _ := Encode(in); string(b) != string(first) {
			t.Fatal("Encode gave two encodings of one instance")
		}
	}
	// Encoding does not touch the caller's instance.
	if in.ModRevision != 9 || in.CreateRevision != 8 {
		t.Fatalf("Encode changed its input: %v", in)
	}
}

func TestEncodeRefusesInvalidUTF8(t *testing.T) {
	if _, err := Encode(&registryv1.Instance{Service: "s", Id: "i", Zone: "\xff"}); err == nil {
		t.Fatal("Encode accepted a string proto cannot carry")
	}
}

func TestDecodeJunk(t *testing.T) {
	k := NewKeys("")
	good, err := Encode(valid())
	if err != nil {
		t.Fatal(err)
	}
	other := valid()
	other.Id = "o-2"
	otherB, _ := Encode(other)
	invalid := valid()
	invalid.Weight = 5000
	invalidB, _ := proto.Marshal(invalid)
	key := k.Instance("orders", "o-1")
	for _, tc := range []struct {
		name, key string
		value     []byte
		want      string // in the error
	}{
		{"key outside the layout", "/registry/v1/other/orders/o-1", good, "is not <prefix>instances"},
		{"key with a deeper id", key + "/x", good, "is not <prefix>instances"},
		{"record of another id", key, otherB, "holds instance orders/o-2"},
		{"not protobuf", key, []byte("{\"service\":\"orders\"}"), "not a registry.v1.Instance"},
		{"fails Validate", key, invalidB, "invalid weight"},
		{"empty value", key, nil, "invalid service"},
		{"over 16 KiB", key, make([]byte, MaxRecordSize+1), "at most 16384"},
		{"address not UTF-8", key, append(append([]byte{}, good...), protowire.AppendString(protowire.AppendTag(nil, 3, protowire.BytesType), "\xff")...), "invalid address: not valid UTF-8"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			inst, err := k.Decode(tc.key, tc.value, 1, 1)
			if inst != nil || !errors.Is(err, ErrJunk) || !strings.Contains(err.Error(), tc.want) {
				t.Fatalf("Decode = %v, %v; want ErrJunk with %q", inst, err, tc.want)
			}
		})
	}
}

// tagged is one field of the wire format: tag, then value.
func tagged(num protowire.Number, typ protowire.Type, value []byte) []byte {
	return append(protowire.AppendTag(nil, num, typ), value...)
}

func lenField(num protowire.Number, payload []byte) []byte {
	return tagged(num, protowire.BytesType, protowire.AppendBytes(nil, payload))
}

func TestUnmarshalNamesTheField(t *testing.T) {
	cat := func(bs ...[]byte) []byte {
		var out []byte
		for _, b := range bs {
			out = append(out, b...)
		}
		return out
	}
	service := lenField(1, []byte("orders"))
	mapEntry := func(k, v string) []byte {
		return lenField(7, cat(lenField(1, []byte(k)), lenField(2, []byte(v))))
	}
	overflow := []byte{0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0x01} // an 11-byte varint
	for _, tc := range []struct {
		name  string
		b     []byte
		field string
		why   string
	}{
		{"address not UTF-8", lenField(1, cat(service, lenField(3, []byte("h\xff:80")))), "instance.address", "not valid UTF-8"},
		{"metadata key not UTF-8", lenField(1, cat(service, mapEntry("\xc3", "v"))), "instance.metadata", "key is not valid UTF-8"},
		{"metadata value not UTF-8", lenField(1, cat(service, mapEntry("k", "\xe2\x82"))), "instance.metadata", "value is not valid UTF-8"},
		{"check target not UTF-8", lenField(1, lenField(8, lenField(2, []byte("/\xff")))), "instance.check.target", "not valid UTF-8"},
		{"interval seconds overflow", lenField(1, lenField(8, lenField(3, tagged(1, protowire.VarintType, overflow)))), "instance.check.interval.seconds", "malformed value"},
		{"weight overflow", lenField(1, tagged(6, protowire.VarintType, overflow)), "instance.weight", "malformed value"},
		{"instance truncated", append(protowire.AppendTag(nil, 1, protowire.BytesType), 50, 'x'), "instance", "malformed value"},
		{"instance's field truncated", lenField(1, append(protowire.AppendTag(nil, 3, protowire.BytesType), 9, 'x')), "instance.address", "malformed value"},
		{"field number 0", []byte{0x02, 0x00}, "request", "malformed field tag"},
		{"end group without a start", tagged(5, protowire.EndGroupType, nil), "request", "malformed"},
		{"reserved wire type", protowire.AppendTag(nil, 99, 7), "request", "malformed"},
		{"reserved wire type on a known field", protowire.AppendTag(nil, 1, 7), "instance", "reserved wire type"},
		{"unknown field truncated", append(protowire.AppendTag(nil, 99, protowire.BytesType), 9), "request", "malformed value"},
		// A known field of another wire type is an unknown field to proto:
		// here a fixed32 whose bytes would read as a bad string. The fault
		// is the truncated zone after it.
		{"known field of another wire type, then a truncated one", lenField(1, cat(
			tagged(3, protowire.Fixed32Type, []byte{0x02, 0xff, 0xfe, 0x00}),
			append(protowire.AppendTag(nil, 4, protowire.BytesType), 9, 'z'))), "instance.zone", "malformed value"},
		{"ttl truncated", append(protowire.AppendTag(nil, 2, protowire.BytesType), 3, 0x08), "ttl", "malformed value"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			if proto.Unmarshal(tc.b, &registryv1.RegisterRequest{}) == nil {
				t.Fatal("proto accepts the input: the case tests nothing")
			}
			m := &registryv1.RegisterRequest{Ttl: nil, Instance: &registryv1.Instance{Service: "left over"}}
			err := Unmarshal(tc.b, m, "request")
			var fe *FieldError
			if !errors.As(err, &fe) || fe.Field != tc.field || !strings.Contains(fe.Reason, tc.why) || !errors.Is(err, ErrInvalid) {
				t.Fatalf("Unmarshal = %v, want field %q with %q", err, tc.field, tc.why)
			}
			if m.Instance != nil {
				t.Fatalf("Unmarshal left a half-decoded message: %v", m)
			}
		})
	}
	// What proto accepts, Unmarshal accepts: unknown fields, and a known
	// field of another wire type (kept as unknown).
	for _, b := range [][]byte{
		nil,
		lenField(1, service),
		cat(lenField(1, service), lenField(99, []byte("\xff"))),
		cat(lenField(1, tagged(6, protowire.BytesType, protowire.AppendBytes(nil, []byte("\xff"))))),
	} {
		var m registryv1.RegisterRequest
		if err := Unmarshal(b, &m, "request"); err != nil {
			t.Errorf("Unmarshal(%x) = %v, want nil", b, err)
		}
	}
}
