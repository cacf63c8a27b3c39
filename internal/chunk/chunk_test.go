package chunk

import (
	"errors"
	"fmt"
	"strings"
	"testing"

	"google.golang.org/protobuf/proto"
	"pgregory.net/rapid"

	registryv1 "github.com/regcluster/registry/proto/registry/v1"
	"github.com/regcluster/registry/record"
)

// instance returns a valid instance of about size bytes encoded.
func instance(i, size int) *registryv1.Instance {
	in := &registryv1.Instance{Service: "bigsvc", Id: fmt.Sprintf("i-%05d", i), Address: "127.0.0.1:9000",
		Lifecycle: registryv1.Lifecycle_LIFECYCLE_SERVING, ModRevision: int64(1000 + i), CreateRevision: int64(i + 1),
		Metadata: map[string]string{}}
	for k := 0; proto.Size(in) < size-1100; k++ {
		in.Metadata[fmt.Sprintf("k%02d", k)] = strings.Repeat("x", record.MaxMetaValueLen)
	}
	if pad := size - proto.Size(in) - 8; pad > 0 {
		in.Version = strings.Repeat("v", pad)
	}
	return in
}

// fataler is what roundTrip needs of a *testing.T or a *rapid.T.
type fataler interface {
	Fatalf(string, ...any)
	Fatal(...any)
}

// roundTrip splits unit, checks every chunk's bound and flags, and joins
// the chunks back.
func roundTrip(t fataler, unit *registryv1.WatchResponse, maxBytes int) (*registryv1.WatchResponse, int) {
	var (
		j      Joiner
		joined *registryv1.WatchResponse
		n      int
	)
	err := Split(unit, maxBytes, func(c *registryv1.WatchResponse) error {
		n++
		if joined != nil {
			t.Fatalf("chunk %d after the unit was complete", n)
		}
		if sz := proto.Size(c); sz > maxBytes {
			t.Fatalf("chunk %d is %d bytes, over the bound %d", n, sz, maxBytes)
		}
		if c.Revision != unit.Revision || c.Epoch != unit.Epoch {
			t.Fatalf("chunk %d at %d/%q, unit at %d/%q", n, c.Revision, c.Epoch, unit.Revision, unit.Epoch)
		}
		// Round-trip through the wire, as a subscriber receives it.
		b, err := proto.Marshal(c)
		if err != nil {
			t.Fatal(err)
		}
		var got registryv1.WatchResponse
		if err := proto.Unmarshal(b, &got); err != nil {
			t.Fatal(err)
		}
		u, err := j.Add(&got)
		if err != nil {
			t.Fatal(err)
		}
		joined = u
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
	if joined == nil || j.Open() {
		t.Fatalf("after %d chunks the unit is still open", n)
	}
	return joined, n
}

// The bound holds for any number of records of up to 16 KiB, and the
// chunks join back into exactly the unit that was split.
func TestSplitBoundAndJoin(t *testing.T) {
	rapid.Check(t, func(rt *rapid.T) {
		count := rapid.IntRange(0, 300).Draw(rt, "count")
		maxBytes := rapid.SampledFrom([]int{MaxBytes, 64 << 10, 40 << 10}).Draw(rt, "maxBytes")
		insts := make([]*registryv1.Instance, count)
		evs := make([]*registryv1.Event, count)
		for i := range insts {
			insts[i] = instance(i, rapid.IntRange(200, record.MaxRecordSize).Draw(rt, "size"))
			if rapid.Bool().Draw(rt, "put") {
				evs[i] = &registryv1.Event{Type: registryv1.Event_TYPE_PUT, Instance: insts[i], Service: "bigsvc", Id: insts[i].Id}
			} else {
				evs[i] = &registryv1.Event{Type: registryv1.Event_TYPE_DELETE, Service: "bigsvc", Id: insts[i].Id}
			}
		}
		snap := &registryv1.WatchResponse{Revision: 77, Epoch: "e1", Kind: &registryv1.WatchResponse_Snapshot{
			Snapshot: &registryv1.Snapshot{Instances: insts, Reset_: true, NewEpoch: rapid.Bool().Draw(rt, "newEpoch")}}}
		events := &registryv1.WatchResponse{Revision: 78, Epoch: "e1", Kind: &registryv1.WatchResponse_Events{
			Events: &registryv1.Events{Events: evs}}}
		for _, unit := range []*registryv1.WatchResponse{snap, events} {
			joined, n := roundTrip(rt, unit, maxBytes)
			if !proto.Equal(joined, unit) {
				rt.Fatalf("joined unit differs from the one split (%d chunks)", n)
			}
			// Packed, not one element per chunk: fewer than twice the
			// minimum number of chunks.
			if min := proto.Size(unit)/maxBytes + 1; n > 2*min {
				rt.Fatalf("%d chunks for %d bytes at most %d each", n, proto.Size(unit), maxBytes)
			}
		}
	})
}

// 1,000 records of about 14 KiB: the case of the issue, at the real bound.
func TestSplitThousandLargeRecords(t *testing.T) {
	insts := make([]*registryv1.Instance, 1000)
	for i := range insts {
		insts[i] = instance(i, 14<<10)
	}
	unit := &registryv1.WatchResponse{Revision: 5, Kind: &registryv1.WatchResponse_Snapshot{Snapshot: &registryv1.Snapshot{Instances: insts}}}
	joined, n := roundTrip(t, unit, MaxBytes)
	if !proto.Equal(joined, unit) {
		t.Fatal("joined snapshot differs")
	}
	total := proto.Size(unit)
	if n < total/MaxBytes+1 || total < 4<<20 {
		t.Fatalf("%d chunks for %d bytes", n, total)
	}
	t.Logf("a snapshot of 1000 records of ~14 KiB: %d bytes in %d chunks of at most %d", total, n, MaxBytes)
}

func TestJoinerRefusesBrokenFraming(t *testing.T) {
	open := &registryv1.WatchResponse{Revision: 9, Epoch: "e", Kind: &registryv1.WatchResponse_Snapshot{Snapshot: &registryv1.Snapshot{More: true}}}
	for name, next := range map[string]*registryv1.WatchResponse{
		"progress":       {Revision: 9, Epoch: "e", Kind: &registryv1.WatchResponse_Progress{Progress: &registryv1.Progress{}}},
		"events":         {Revision: 9, Epoch: "e", Kind: &registryv1.WatchResponse_Events{Events: &registryv1.Events{}}},
		"other revision": {Revision: 10, Epoch: "e", Kind: &registryv1.WatchResponse_Snapshot{Snapshot: &registryv1.Snapshot{}}},
		"other epoch":    {Revision: 9, Epoch: "f", Kind: &registryv1.WatchResponse_Snapshot{Snapshot: &registryv1.Snapshot{}}},
		"other flags":    {Revision: 9, Epoch: "e", Kind: &registryv1.WatchResponse_Snapshot{Snapshot: &registryv1.Snapshot{Reset_: true}}},
	} {
		var j Joiner
		if u, err := j.Add(open); u != nil || err != nil {
			t.Fatalf("%s: first chunk gave %v, %v", name, u, err)
		}
		if _, err := j.Add(next); !errors.Is(err, ErrFraming) {
			t.Errorf("%s inside an open snapshot: err %v, want ErrFraming", name, err)
		}
		if j.Open() {
			t.Errorf("%s: the broken unit is still open", name)
		}
	}
}
