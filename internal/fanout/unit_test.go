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
	body, err := newBody(insts, nil)
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
	// An empty snapshot is one chunk.
	empty, _ := newBody(nil, nil)
	if c := empty.chunks(cache.Batch{Revision: 3, Epoch: "e", Snapshot: true}, maxBytes); len(c) != 1 {
		t.Fatalf("empty snapshot in %d chunks", len(c))
	}
}

// A body reuses the stored bytes of every instance the cache still holds
// unchanged, and encodes the changed ones.
func TestBodyReusesUnchangedInstances(t *testing.T) {
	a, b, c := sized(1, 10), sized(2, 10), sized(3, 10)
	first, err := newBody([]*registryv1.Instance{a, b}, nil)
	if err != nil {
		t.Fatal(err)
	}
	b2 := sized(2, 20)
	second, err := newBody([]*registryv1.Instance{a, b2, c}, first)
	if err != nil {
		t.Fatal(err)
	}
	if &second.elems[0][0] != &first.elems[0][0] {
		t.Fatal("an unchanged instance was encoded again")
	}
	if &second.elems[1][0] == &first.elems[1][0] {
		t.Fatal("a changed instance kept its old bytes")
	}
	var r registryv1.WatchResponse
	if err := proto.Unmarshal(second.chunks(cache.Batch{Revision: 5, Snapshot: true}, chunk.MaxBytes)[0], &r); err != nil {
		t.Fatal(err)
	}
	if got := r.GetSnapshot().GetInstances(); len(got) != 3 || !proto.Equal(got[1], b2) {
		t.Fatalf("second body decodes to %v", got)
	}
}
