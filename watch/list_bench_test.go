package watch_test

import (
	"context"
	"errors"
	"fmt"
	"testing"
	"time"

	clientv3 "go.etcd.io/etcd/client/v3"
	"google.golang.org/protobuf/types/known/timestamppb"

	"github.com/regcluster/registry/cache"
	"github.com/regcluster/registry/internal/etcdtest"
	registryv1 "github.com/regcluster/registry/proto/registry/v1"
	"github.com/regcluster/registry/record"
	"github.com/regcluster/registry/watch"
)

// BenchmarkList: a Watcher's list of 100,000 records (regbench resync's)
// from an embedded etcd in pages of 1000 (the default) or 5000, until its
// snapshot is delivered. etcd counts the rest of the range on every page
// (its index visits every key to the end to fill Count), so a list costs
// etcd O(N²/page).
func BenchmarkList(b *testing.B) {
	for _, ps := range []int64{1000, 5000} {
		b.Run(fmt.Sprintf("page=%d", ps), func(b *testing.B) { benchList(b, ps) })
	}
}

func benchList(b *testing.B, pageSize int64) {
	const N, batch = 100000, 128
	cli := etcdtest.Start(b, false).Client(b)
	ctx := context.Background()
	for from := 0; from < N; from += batch {
		ops := make([]clientv3.Op, 0, batch)
		for k := from; k < min(from+batch, N); k++ {
			in := &registryv1.Instance{Service: "big", Id: fmt.Sprintf("i%06d", k),
				Address: fmt.Sprintf("10.%d.%d.%d:8080", k/65536%256, k/256%256, k%256), Zone: fmt.Sprintf("z%d", k%3),
				Version: "1.0.0", Weight: 100, Lifecycle: registryv1.Lifecycle_LIFECYCLE_SERVING,
				Health: &registryv1.Health{State: registryv1.HealthState_HEALTH_STATE_HEALTHY,
					Since: timestamppb.New(time.Date(2025, 1, 1, 0, 0, 0, 0, time.UTC))}}
			v, err := record.Encode(in)
			if err != nil {
				b.Fatal(err)
			}
			ops = append(ops, clientv3.OpPut(keys.Instance("big", in.Id), string(v)))
		}
		if _, err := cli.Txn(ctx).Then(ops...).Commit(); err != nil {
			b.Fatal(err)
		}
	}
	stop := errors.New("listed")
	b.ReportAllocs()
	b.ResetTimer()
	for range b.N {
		w, err := watch.New(watch.Config{Client: cli, PageSize: pageSize})
		if err != nil {
			b.Fatal(err)
		}
		err = w.Run(ctx, func(bt cache.Batch) error {
			if len(bt.Instances) != N {
				return fmt.Errorf("listed %d", len(bt.Instances))
			}
			return stop
		})
		if !errors.Is(err, stop) {
			b.Fatal(err)
		}
	}
}
