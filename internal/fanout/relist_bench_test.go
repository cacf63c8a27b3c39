package fanout

import (
	"context"
	"fmt"
	"log/slog"
	"testing"
	"time"

	"google.golang.org/protobuf/types/known/timestamppb"

	"github.com/regcluster/registry/cache"
	registryv1 "github.com/regcluster/registry/proto/registry/v1"
	"github.com/regcluster/registry/record"
)

// BenchmarkRelistSnapshot: 100,000 instances of one service (regbench
// resync's records). Timed: a relist batch as the watcher delivers it
// (every record decoded afresh, 100 of them changed) is applied, and a
// subscriber's reset snapshot is built and framed into its chunks
// (reset); or a new subscriber's snapshot on a regnode whose cache that
// relist just filled (cold). Not timed: decoding the batch.
func BenchmarkRelistSnapshot(b *testing.B) {
	const N = 100000
	keys := record.NewKeys("")
	values := make([][]byte, N)
	for k := range values {
		v, err := record.Encode(benchRecord(k, 0))
		if err != nil {
			b.Fatal(err)
		}
		values[k] = v
	}
	// relist is the watcher's batch at rev: records decoded from etcd's
	// bytes, the 100 from churn*100 on changed at revision rev.
	relist := func(rev int64, churn int) cache.Batch {
		bt := cache.Batch{Revision: rev, Snapshot: true, Reset: true, Epoch: "e1",
			Instances: make([]*registryv1.Instance, 0, N), Encoded: make([][]byte, 0, N)}
		for k, v := range values {
			mod := int64(2 + k)
			if k/100 == churn%(N/100) {
				in := benchRecord(k, churn)
				var err error
				if v, err = record.Encode(in); err != nil {
					b.Fatal(err)
				}
				mod = rev
			}
			in, err := keys.Decode(keys.Instance("big", benchID(k)), v, 2+int64(k), mod)
			if err != nil {
				b.Fatal(err)
			}
			bt.Instances = append(bt.Instances, in)
			bt.Encoded = append(bt.Encoded, record.Element(1, v, 2+int64(k), mod)) // relist-bench:encoded
		}
		return bt
	}
	hub := func() *Hub {
		return newHub(Config{RingSize: 10000, QueueSize: 1024, CatchUpTimeout: time.Second, Logger: slog.New(slog.DiscardHandler)})
	}
	chunks := func(u *Unit) {
		c, err := u.Chunks()
		if err != nil || len(c) < 2 || len(u.Batch().Instances) != N {
			b.Fatalf("%d chunks, %d instances: %v", len(c), len(u.Batch().Instances), err)
		}
	}
	ctx := context.Background()
	b.Run("reset", func(b *testing.B) {
		h := hub()
		if err := h.apply(relist(1<<20, 0)); err != nil {
			b.Fatal(err)
		}
		s, err := h.Subscribe(ctx, "big", 0, "")
		if err != nil {
			b.Fatal(err)
		}
		defer s.Close()
		if _, err := s.Next(ctx); err != nil {
			b.Fatal(err)
		}
		b.ReportAllocs()
		b.ResetTimer()
		for i := range b.N {
			b.StopTimer()
			bt := relist(int64(1<<20+i+1), i+1)
			b.StartTimer()
			if err := h.apply(bt); err != nil {
				b.Fatal(err)
			}
			u, err := s.Next(ctx)
			if err != nil || !u.Batch().Snapshot || !u.Batch().Reset {
				b.Fatalf("after a relist: %v, %v", u, err)
			}
			chunks(u)
		}
	})
	b.Run("cold", func(b *testing.B) {
		b.ReportAllocs()
		b.ResetTimer()
		for i := range b.N {
			b.StopTimer()
			h := hub()
			if err := h.apply(relist(int64(1<<20+i+1), i+1)); err != nil {
				b.Fatal(err)
			}
			b.StartTimer()
			s, err := h.Subscribe(ctx, "big", 0, "")
			if err != nil {
				b.Fatal(err)
			}
			u, err := s.Next(ctx)
			if err != nil {
				b.Fatal(err)
			}
			chunks(u)
			b.StopTimer()
			s.Close()
			b.StartTimer()
		}
	})
}

func benchID(k int) string { return fmt.Sprintf("i%06d", k) }

// benchRecord is regbench resync's instanceN.
func benchRecord(k, version int) *registryv1.Instance {
	return &registryv1.Instance{Service: "big", Id: benchID(k),
		Address:   fmt.Sprintf("10.%d.%d.%d:8080", k/65536%256, k/256%256, k%256),
		Zone:      fmt.Sprintf("z%d", k%3),
		Version:   fmt.Sprintf("1.0.%d", version),
		Weight:    100,
		Lifecycle: registryv1.Lifecycle_LIFECYCLE_SERVING,
		Health:    &registryv1.Health{State: registryv1.HealthState_HEALTH_STATE_HEALTHY, Since: timestamppb.New(time.Date(2025, 1, 1, 0, 0, 0, 0, time.UTC))},
	}
}
