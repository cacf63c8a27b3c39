package cache

import (
	"math/rand/v2"
	"strconv"
	"sync"
	"sync/atomic"
	"testing"

	registryv1 "github.com/regcluster/registry/proto/registry/v1"
)

// TestConcurrentReads applies batches from one goroutine while others read.
// Run it under -race. Every record is written with ModRevision = its batch's
// revision, so a reader can check that each view it gets is whole: no
// record newer than the view's revision, lists sorted, counts consistent,
// and revisions that never go down.
func TestConcurrentReads(t *testing.T) { concurrentReads(t, 20) }

// TestConcurrentReadsLarge is TestConcurrentReads with services large
// enough (up to 2,000 instances) that batches edit their trees rather than
// rebuild them, and readers race to build each version's flat slice.
func TestConcurrentReadsLarge(t *testing.T) { concurrentReads(t, 2_000) }

func concurrentReads(t *testing.T, ids int) {
	const (
		readers  = 4
		batches  = 3000
		services = 4
	)
	c := New()
	var done atomic.Bool
	var wg sync.WaitGroup
	for r := range readers {
		wg.Go(func() {
			var last int64
			reads := 0
			for !done.Load() || reads == 0 {
				reads++
				s := c.Snapshot()
				if s.Revision() < last {
					t.Errorf("reader %d: revision went down from %d to %d", r, last, s.Revision())
					return
				}
				last = s.Revision()
				n := 0
				for _, svc := range s.Services() {
					list := s.Instances(svc)
					if len(list) == 0 {
						t.Errorf("reader %d: service %s listed with no instances", r, svc)
						return
					}
					for i, inst := range list {
						if inst.ModRevision > s.Revision() || inst.Service != svc || (i > 0 && list[i-1].Id >= inst.Id) {
							t.Errorf("reader %d: view at %d holds %s/%s@%d at index %d", r, s.Revision(), inst.Service, inst.Id, inst.ModRevision, i)
							return
						}
					}
					n += len(list)
					if s.Count(svc) != len(list) {
						t.Errorf("reader %d: Count(%s) = %d, Instances holds %d", r, svc, s.Count(svc), len(list))
						return
					}
					i := 0
					for inst := range s.Each(svc) {
						if i >= len(list) || inst != list[i] {
							t.Errorf("reader %d: Each(%s) differs from Instances at %d", r, svc, i)
							return
						}
						i++
					}
				}
				if n != s.Len() {
					t.Errorf("reader %d: view at %d holds %d instances, Len %d", r, s.Revision(), n, s.Len())
					return
				}
				// The Cache's own readers: each call sees some whole view.
				rev := c.Revision()
				for _, inst := range c.Instances("s1") {
					if inst.ModRevision > c.Revision() {
						t.Errorf("reader %d: Instances holds a record from the future", r)
						return
					}
				}
				if inst, ok := c.Get("s2", "7"); ok && inst.Id != "7" {
					t.Errorf("reader %d: Get returned %s", r, inst.Id)
				}
				_ = c.Len()
				if c.Revision() < rev {
					t.Errorf("reader %d: Revision went down", r)
					return
				}
			}
		})
	}

	rng := rand.New(rand.NewPCG(1, 2))
	rev := int64(0)
	for b := range batches {
		rev += 1 + rng.Int64N(3)
		var batch Batch
		switch {
		case b%500 == 0:
			batch = Batch{Revision: rev, Snapshot: true, Reset: b > 0}
			for range rng.IntN(services * ids) {
				batch.Instances = append(batch.Instances, raceRecord(rng, rev, services, ids))
			}
		case b%50 == 0:
			batch = Batch{Revision: rev}
		default:
			batch = Batch{Revision: rev}
			for range 1 + rng.IntN(4) {
				inst := raceRecord(rng, rev, services, ids)
				if rng.IntN(3) == 0 {
					batch.Events = append(batch.Events, Event{Type: Delete, Service: inst.Service, ID: inst.Id})
				} else {
					batch.Events = append(batch.Events, Event{Type: Put, Instance: inst})
				}
			}
		}
		if _, err := c.Apply(batch); err != nil {
			t.Fatalf("batch %d: %v", b, err)
		}
		if b%100 == 0 { // a stale one now and then, refused
			if _, err := c.Apply(Batch{Revision: rev - 1, Events: []Event{{Type: Delete, Service: "s1", ID: "1"}}}); err == nil {
				t.Fatalf("stale batch accepted")
			}
		}
	}
	done.Store(true)
	wg.Wait()
	if got := c.Revision(); got != rev {
		t.Fatalf("revision %d, want %d", got, rev)
	}
}

func raceRecord(rng *rand.Rand, rev int64, services, ids int) *registryv1.Instance {
	return &registryv1.Instance{
		Service:     "s" + strconv.Itoa(rng.IntN(services)),
		Id:          strconv.Itoa(rng.IntN(ids)),
		Address:     "10.0.0." + strconv.Itoa(rng.IntN(250)) + ":80",
		ModRevision: rev,
	}
}
