package balance

import (
	"sync"
	"sync/atomic"
	"time"
)

// Metrics counts what the balancer and the retry interceptor decide. It
// is safe for concurrent use; one Metrics may be shared by every channel
// of a client (the client's resolver passes its own in Service).
type Metrics struct {
	ejections        atomic.Int64
	returns          atomic.Int64
	ejectionsCapped  atomic.Int64
	halfOpenProbes   atomic.Int64
	panicEnters      atomic.Int64
	panicLeaves      atomic.Int64
	retries          atomic.Int64
	budgetExhausted  atomic.Int64
	panicking        atomic.Int64 // channels in panic mode now
	noInstanceErrors atomic.Int64
	diskLoads        atomic.Int64
	lastResorts      atomic.Int64

	mu      sync.Mutex
	disk    map[string]time.Time     // by service: the saved time of the disk view served now
	merged  map[string]*atomic.Int64 // by service: subscription callbacks coalesced
	held    map[string]int64         // by service: instances held as a last resort now
	picks   map[string]*atomic.Int64 // by service/id
	weights map[string]*atomic.Int64 // by service/id: the weight the picker uses now
	calls   map[[2]string]*callCounts
}

// callCounts are one instance's classified call ends since the last
// TakeCalls.
type callCounts struct {
	ok, fail atomic.Int64
	ejected  atomic.Bool
}

// NewMetrics returns zeroed counts.
func NewMetrics() *Metrics {
	return &Metrics{picks: map[string]*atomic.Int64{}, weights: map[string]*atomic.Int64{}, disk: map[string]time.Time{},
		merged: map[string]*atomic.Int64{}, held: map[string]int64{}, calls: map[[2]string]*callCounts{}}
}

// Counts is a copy of the counts at one moment.
type Counts struct {
	// Ejections and Returns of instances by the outlier detector.
	Ejections, Returns int64
	// EjectionsCapped counts ejections refused by MaxEjectionPercent.
	EjectionsCapped int64
	// HalfOpenProbes counts calls let through to an ejected instance.
	HalfOpenProbes int64
	// PanicEnters and PanicLeaves count panic mode transitions;
	// Panicking is the number of channels in panic mode now.
	PanicEnters, PanicLeaves, Panicking int64
	// Retries counts retry attempts made; BudgetExhausted the retries
	// refused by the retry budget.
	Retries, BudgetExhausted int64
	// NoInstance counts picks failed because nothing could be called.
	NoInstance int64
	// Picks by "service/id".
	Picks map[string]int64
	// Weights by "service/id": the weight the latest picker gives the
	// instance (slow start included); absent while it cannot be picked
	// or is ejected.
	Weights map[string]int64
	// DiskLoads counts last-known-good views served from disk (package
	// client, Config.CacheDir).
	DiskLoads int64
	// DiskSavedAt, by service, is when the disk view served now was saved
	// (its age); a service leaves it when a live view replaces it.
	DiskSavedAt map[string]time.Time
	// CallbacksCoalesced, by service, counts the times a subscription's
	// callbacks fell too far behind and the changes waiting for them were
	// replaced by one snapshot (package client, SubscribeOptions.OnChange).
	CallbacksCoalesced map[string]int64
	// LastResorts counts the last resorts started: a service whose
	// routable instances mostly vanished by lease expiry kept as a last
	// resort (package client, Config.LastResort).
	LastResorts int64
	// LastResortHeld, by service, is how many vanished instances are held
	// as a last resort now (called only while nothing else is routable);
	// a service leaves it when its last resort ends.
	LastResortHeld map[string]int64
}

// LastResortStarted records that service's last resort started with n
// instances held (package client calls it).
func (m *Metrics) LastResortStarted(service string, n int) {
	m.lastResorts.Add(1)
	m.LastResortHolds(service, n)
}

// LastResortHolds records that service holds n instances as a last
// resort now; 0 when it ended.
func (m *Metrics) LastResortHolds(service string, n int) {
	m.mu.Lock()
	defer m.mu.Unlock()
	if n == 0 {
		delete(m.held, service)
		return
	}
	m.held[service] = int64(n)
}

// DiskCacheLoaded records that service is served from a disk view saved
// at saved (package client calls it).
func (m *Metrics) DiskCacheLoaded(service string, saved time.Time) {
	m.diskLoads.Add(1)
	m.mu.Lock()
	m.disk[service] = saved
	m.mu.Unlock()
}

// DiskCacheReplaced records that service no longer serves a disk view.
func (m *Metrics) DiskCacheReplaced(service string) {
	m.mu.Lock()
	delete(m.disk, service)
	m.mu.Unlock()
}

// CallbacksCoalesced records that the changes waiting for the callbacks
// of a subscription of service were coalesced into a snapshot (package
// client calls it).
func (m *Metrics) CallbacksCoalesced(service string) {
	m.mu.Lock()
	c := m.merged[service]
	if c == nil {
		c = new(atomic.Int64)
		m.merged[service] = c
	}
	m.mu.Unlock()
	c.Add(1)
}

// Counts returns the current counts.
func (m *Metrics) Counts() Counts {
	c := Counts{
		Ejections: m.ejections.Load(), Returns: m.returns.Load(), EjectionsCapped: m.ejectionsCapped.Load(),
		HalfOpenProbes: m.halfOpenProbes.Load(), PanicEnters: m.panicEnters.Load(), PanicLeaves: m.panicLeaves.Load(),
		Panicking: m.panicking.Load(), Retries: m.retries.Load(), BudgetExhausted: m.budgetExhausted.Load(),
		NoInstance: m.noInstanceErrors.Load(), Picks: map[string]int64{}, Weights: map[string]int64{},
		DiskLoads: m.diskLoads.Load(), DiskSavedAt: map[string]time.Time{}, CallbacksCoalesced: map[string]int64{},
		LastResorts: m.lastResorts.Load(), LastResortHeld: map[string]int64{},
	}
	m.mu.Lock()
	for k, v := range m.disk {
		c.DiskSavedAt[k] = v
	}
	for k, v := range m.held {
		c.LastResortHeld[k] = v
	}
	for k, v := range m.merged {
		c.CallbacksCoalesced[k] = v.Load()
	}
	for k, v := range m.picks {
		c.Picks[k] = v.Load()
	}
	for k, v := range m.weights {
		if w := v.Load(); w > 0 {
			c.Weights[k] = w
		}
	}
	m.mu.Unlock()
	return c
}

// pickCounter returns the pick counter of one instance, made once so the
// pick path only does an atomic add.
func (m *Metrics) pickCounter(service, id string) *atomic.Int64 {
	k := service + "/" + id
	m.mu.Lock()
	defer m.mu.Unlock()
	c := m.picks[k]
	if c == nil {
		c = new(atomic.Int64)
		m.picks[k] = c
	}
	return c
}

// setWeights records the weights of one service's latest picker.
func (m *Metrics) setWeights(service string, w map[string]uint64) {
	m.mu.Lock()
	defer m.mu.Unlock()
	for k, v := range m.weights {
		if len(k) > len(service) && k[:len(service)+1] == service+"/" {
			if _, ok := w[k[len(service)+1:]]; !ok {
				v.Store(0)
			}
		}
	}
	for id, x := range w {
		k := service + "/" + id
		v := m.weights[k]
		if v == nil {
			v = new(atomic.Int64)
			m.weights[k] = v
		}
		v.Store(int64(x))
	}
}

// callCounter returns the call counts of one instance, made once so the
// call path only does an atomic add.
func (m *Metrics) callCounter(service, id string) *callCounts {
	k := [2]string{service, id}
	m.mu.Lock()
	defer m.mu.Unlock()
	c := m.calls[k]
	if c == nil {
		c = new(callCounts)
		m.calls[k] = c
	}
	return c
}

// InstanceCalls is what calls to one instance saw: instance-level
// failures (Unavailable, DeadlineExceeded, ResourceExhausted, connection
// errors: what ejects it) and successes (any answer, whatever the
// application said). Cancelled calls count as neither.
type InstanceCalls struct {
	ID                  string
	Failures, Successes uint32
	// Ejected: outlier detection holds the instance out now (its calls
	// failed; few or none go to it while it is out).
	Ejected bool
}

// TakeCalls returns, by service, the calls to each instance since the
// last TakeCalls (only instances called since, or ejected now), and
// starts counting afresh: what a Client reports to the registry (callers' reports).
func (m *Metrics) TakeCalls() map[string][]InstanceCalls {
	m.mu.Lock()
	defer m.mu.Unlock()
	out := map[string][]InstanceCalls{}
	for k, c := range m.calls {
		ok, fail, ejected := c.ok.Swap(0), c.fail.Swap(0), c.ejected.Load()
		if ok == 0 && fail == 0 && !ejected {
			continue
		}
		clamp := func(n int64) uint32 { return uint32(min(n, int64(^uint32(0)))) }
		out[k[0]] = append(out[k[0]], InstanceCalls{ID: k[1], Failures: clamp(fail), Successes: clamp(ok), Ejected: ejected})
	}
	return out
}
