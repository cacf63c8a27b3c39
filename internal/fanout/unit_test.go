package fanout

import (
	"fmt"
	"strings"
	"testing"

	"google.golang.org/protobuf/proto"

	"github.com/regcluster/registry/cache"
	"github.com/regcluster/registry/internal/chunk"
	registryv1 "github.com/regcluster/registry/proto/registry/v1"
)

func sized(i, n int) *registryv1.Instance {
	in := inst("orders", fmt.Sprintf("o-%03d", i), i)
	in.Metadata = map[string]string{"blob": strings.Repeat("x", n)}
	in.ModRevision = int64(100 + i)
	return in
}

// Snapshot chunks framed by hand from stored instance bytes decode to the
// snapshot, each within the bound and as full as it can be, flags and
// more set as chunk.Split sets them.
func TestSnapshotChunksFromStoredBytes(t *testing.T) {
	const maxBytes = 4000
	var insts []*registryv1.Instance
	for i := range 40 {
		insts = append(insts, sized(i, (i*397)%1500))
	}
	insts = append(insts, sized(99, 5000)) // larger than a chunk: goes alone
	body, err := newBody([][]*registryv1.Instance{insts}, nil, nil, "", 0)
	if err != nil {
		t.Fatal(err)
	}
	for _, b := range []cache.Batch{
		{Revision: 1 << 40, Epoch: "e-1234", Snapshot: true, Reset: true, NewEpoch: true},
		{Revision: 7, Snapshot: true},
	} {
		chunks := body.chunks(b, maxBytes)
		var got []*registryv1.Instance
		for i, c := range chunks {
			var r registryv1.WatchResponse
			if err := proto.Unmarshal(c, &r); err != nil {
				t.Fatalf("chunk %d: %v", i, err)
			}
			s := r.GetSnapshot()
			last := i == len(chunks)-1
			if s == nil || r.Revision != b.Revision || r.Epoch != b.Epoch || s.Reset_ != b.Reset || s.NewEpoch != b.NewEpoch || s.More == last {
				t.Fatalf("chunk %d of %d: %v", i, len(chunks), &r)
			}
			if len(c) != proto.Size(&r) {
				t.Fatalf("chunk %d is %d bytes, its message %d", i, len(c), proto.Size(&r))
			}
			if len(c) > maxBytes && len(s.Instances) > 1 {
				t.Fatalf("chunk %d is %d bytes with %d instances, over %d", i, len(c), len(s.Instances), maxBytes)
			}
			// As full as it can be: the next instance would not fit.
			if !last && len(got)+len(s.Instances) < len(insts) {
				nextCost := chunk.Cost(proto.Size(insts[len(got)+len(s.Instances)]))
				if len(c)+nextCost <= maxBytes-6 {
					t.Fatalf("chunk %d is %d bytes and the next instance (%d) would fit", i, len(c), nextCost)
				}
			}
			got = append(got, s.Instances...)
		}
		if len(got) != len(insts) {
			t.Fatalf("%d instances in the chunks, want %d", len(got), len(insts))
		}
		for i := range got {
			if !proto.Equal(got[i], insts[i]) {
				t.Fatalf("instance %d decodes to %v, want %v", i, got[i], insts[i])
			}
		}
	}
	// Every bound, not one: a framing a few bytes off shows at some.
	flags := cache.Batch{Revision: 1 << 40, Epoch: "e-1234", Snapshot: true, Reset: true, NewEpoch: true}
	for max := 1600; max < 1900; max++ {
		for i, c := range body.chunks(flags, max) {
			if len(c) <= max {
				continue
			}
			var r registryv1.WatchResponse
			if err := proto.Unmarshal(c, &r); err != nil || len(r.GetSnapshot().GetInstances()) > 1 {
				t.Fatalf("bound %d: chunk %d is %d bytes (%v)", max, i, len(c), err)
			}
		}
	}
	// An empty snapshot is one chunk.
	empty, _ := newBody(nil, nil, nil, "", 0)
	if c := empty.chunks(cache.Batch{Revision: 3, Epoch: "e", Snapshot: true}, maxBytes); len(c) != 1 {
		t.Fatalf("empty snapshot in %d chunks", len(c))
	}
}

// A body reuses the stored bytes of every instance the cache still holds
// unchanged, and of every service it holds unchanged, and encodes the
// changed ones.
func TestBodyReusesUnchangedInstances(t *testing.T) {
	a, b, c := sized(1, 10), sized(2, 10), sized(3, 10)
	users := []*registryv1.Instance{inst("users", "u1", 1), inst("users", "u2", 1)}
	first, err := newBody([][]*registryv1.Instance{{a, b}, users}, nil, nil, "", 0)
	if err != nil {
		t.Fatal(err)
	}
	b2 := sized(2, 20)
	second, err := newBody([][]*registryv1.Instance{{a, b2, c}, users}, first, nil, "", 0)
	if err != nil {
		t.Fatal(err)
	}
	if &second.parts[0].elems[0][0] != &first.parts[0].elems[0][0] {
		t.Fatal("an unchanged instance was encoded again")
	}
	if &second.parts[0].elems[1][0] == &first.parts[0].elems[1][0] {
		t.Fatal("a changed instance kept its old bytes")
	}
	if second.parts[1] != first.parts[1] {
		t.Fatal("an unchanged service was encoded again")
	}
	var r registryv1.WatchResponse
	if err := proto.Unmarshal(second.chunks(cache.Batch{Revision: 5, Snapshot: true}, chunk.MaxBytes)[0], &r); err != nil {
		t.Fatal(err)
	}
	got := r.GetSnapshot().GetInstances()
	want := []*registryv1.Instance{a, b2, c, users[0], users[1]}
	if len(got) != len(want) {
		t.Fatalf("second body decodes to %d instances, want %d", len(got), len(want))
	}
	for i := range want {
		if !proto.Equal(got[i], want[i]) {
			t.Fatalf("instance %d decodes to %v, want %v", i, got[i], want[i])
		}
	}
}
