package main

import (
	"math"
	"slices"
	"sync"
	"time"
)

// summarize returns p50, p99 and max of ds in milliseconds (nearest rank).
func summarize(ds []time.Duration) Lat {
	if len(ds) == 0 {
		return Lat{}
	}
	s := slices.Clone(ds)
	slices.Sort(s)
	ms := func(d time.Duration) float64 { return float64(d) / float64(time.Millisecond) }
	return Lat{P50: ms(rank(s, 0.50)), P99: ms(rank(s, 0.99)), Max: ms(s[len(s)-1]), N: len(s)}
}

func rank(s []time.Duration, p float64) time.Duration {
	i := int(math.Ceil(p*float64(len(s)))) - 1
	return s[max(0, min(i, len(s)-1))]
}

func median(xs []float64) float64 {
	if len(xs) == 0 {
		return 0
	}
	s := slices.Clone(xs)
	slices.Sort(s)
	if len(s)%2 == 1 {
		return s[len(s)/2]
	}
	return (s[len(s)/2-1] + s[len(s)/2]) / 2
}

func ms(d time.Duration) float64 { return round3(float64(d) / float64(time.Millisecond)) }

// commit is one write: its key (an etcd revision, or an index in a plan of
// writes) and the time its etcd call returned.
type commit struct {
	key int64
	at  time.Time
}

// sighting is when a consumer first saw its view reach key.
type sighting struct {
	key int64
	at  time.Time
}

// observer records, for one consumer, the times its view moved forward. Keys
// only go up: a sighting at key K covers every write with key <= K.
type observer struct {
	mu   sync.Mutex
	seen []sighting
}

func (o *observer) saw(key int64, at time.Time) {
	o.mu.Lock()
	if n := len(o.seen); n == 0 || key > o.seen[n-1].key {
		o.seen = append(o.seen, sighting{key, at})
	}
	o.mu.Unlock()
}

// reached reports whether the view has reached key.
func (o *observer) reached(key int64) bool {
	o.mu.Lock()
	defer o.mu.Unlock()
	return len(o.seen) > 0 && o.seen[len(o.seen)-1].key >= key
}

func (o *observer) reset() {
	o.mu.Lock()
	o.seen = o.seen[:0]
	o.mu.Unlock()
}

// latencies matches writes (in key order) against what each observer saw:
// the latency of a write for one observer is the first sighting at or past
// its key minus its commit time. A sighting before the commit time (the
// watch event overtook the Put's response) counts as 0 and in early; a
// write never seen counts in missed.
func latencies(writes []commit, obs []*observer) (ds []time.Duration, early, missed int) {
	ds = make([]time.Duration, 0, len(writes)*len(obs))
	for _, o := range obs {
		o.mu.Lock()
		seen := o.seen
		j := 0
		for _, w := range writes {
			for j < len(seen) && seen[j].key < w.key {
				j++
			}
			if j == len(seen) {
				missed++
				continue
			}
			d := seen[j].at.Sub(w.at)
			if d < 0 {
				early++
				d = 0
			}
			ds = append(ds, d)
		}
		o.mu.Unlock()
	}
	return ds, early, missed
}
