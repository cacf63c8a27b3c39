package record

import (
	"math"
	"strings"
	"testing"

	"google.golang.org/protobuf/encoding/protowire"
	"google.golang.org/protobuf/proto"

	registryv1 "github.com/regcluster/registry/proto/registry/v1"
)

// An element's payload decodes to exactly what Decode returns for the same
// stored bytes and revisions (proto.Equal, unknown fields included),
// whatever revisions the stored bytes themselves carry, for records at
// their size cap and revisions at the ends of their range; and the element
// is one field: an element of Snapshot.instances.
func TestElementIsWhatDecodeReturns(t *testing.T) {
	k := NewKeys("")
	key := k.Instance("orders", "o-1")
	stored := func(in *registryv1.Instance) []byte {
		b, err := Encode(in)
		if err != nil {
			t.Fatal(err)
		}
		return b
	}
	big := valid()
	big.Metadata = meta(15, 0, MaxMetaValueLen)
	big.Metadata["pad"] = ""
	for n := 128; proto.Size(big) < MaxRecordSize; n++ {
		big.Metadata["pad"] = strings.Repeat("p", n)
	}
	if proto.Size(big) != MaxRecordSize {
		t.Fatalf("could not build a record of %d bytes", MaxRecordSize)
	}
	// Fields of a newer schema: this one keeps them as unknown fields.
	var unknown []byte
	unknown = protowire.AppendTag(unknown, 99, protowire.BytesType)
	unknown = protowire.AppendString(unknown, "from a newer regnode")
	unknown = protowire.AppendTag(unknown, 100, protowire.VarintType)
	unknown = protowire.AppendVarint(unknown, math.MaxUint64)
	// Revisions written into the value by someone else: etcd's win.
	var revs []byte
	revs = protowire.AppendTag(revs, 15, protowire.VarintType)
	revs = protowire.AppendVarint(revs, 12345)
	revs = protowire.AppendTag(revs, 16, protowire.VarintType)
	revs = protowire.AppendVarint(revs, 777)
	cases := []struct {
		name             string
		value            []byte
		createRev, modRv int64
	}{
		{"plain", stored(valid()), 3, 4},
		{"unknown fields", append(stored(valid()), unknown...), 3, 4},
		{"revisions in the value", append(stored(valid()), revs...), 5, 9},
		{"revisions in the value, etcd's zero", append(stored(valid()), revs...), 0, 0},
		{"at the size cap", stored(big), 1, 2},
		{"largest revisions", stored(big), math.MaxInt64, math.MaxInt64},
		{"one-byte revisions", stored(valid()), 1, 1},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			want, err := k.Decode(key, c.value, c.createRev, c.modRv)
			if err != nil {
				t.Fatalf("Decode: %v", err)
			}
			e := Element(1, c.value, c.createRev, c.modRv)
			if len(e) != cap(e) {
				t.Fatalf("element is %d bytes in %d: not sized exactly", len(e), cap(e))
			}
			payload := ElementPayload(e)
			if payload == nil {
				t.Fatal("ElementPayload refused an element")
			}
			var got registryv1.Instance
			if err := proto.Unmarshal(payload, &got); err != nil {
				t.Fatal(err)
			}
			if !proto.Equal(&got, want) {
				t.Fatalf("element decodes to %v, Decode to %v", &got, want)
			}
			// As the one element of a Snapshot.
			var snap registryv1.Snapshot
			if err := proto.Unmarshal(e, &snap); err != nil || len(snap.Instances) != 1 || !proto.Equal(snap.Instances[0], want) {
				t.Fatalf("as a Snapshot: %v, %v", &snap, err)
			}
		})
	}
	// Not one field: refused.
	e := Element(1, stored(valid()), 1, 2)
	for _, bad := range [][]byte{nil, e[:len(e)-1], append(append([]byte{}, e...), 0), {0x08, 0x01}} {
		if ElementPayload(bad) != nil {
			t.Fatalf("ElementPayload(%x) accepted", bad)
		}
	}
}
