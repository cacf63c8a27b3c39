package peerlimit

import (
	"fmt"
	"sync"
	"time"
)

// Registrations held.
//
// A key holds a registration from the moment this regnode grants it
// (Reserve, then Granted) until this regnode learns it has ended. It
// learns that in three ways, whichever comes first:
//
//   - a Deregister through this regnode succeeded (Ended);
//   - a KeepAlive through this regnode was told the lease is lost (Lost);
//   - its view of etcd (the fan-out's cache, which sees every delete,
//     whoever made it, and every lease expiry or revoke) no longer has the
//     record under the lease this regnode granted (Sweep): deleted, expired,
//     revoked, or replaced through another regnode.
//
// A re-Register that replaces a record this regnode granted moves the
// hold to the new lease (and to the new key, if another key made it): it
// is never counted twice.
//
// The counts live in this regnode's memory only, so:
//
//   - each regnode counts what it granted: a key spreading its Registers
//     over N regnodes may hold N times the cap in all;
//   - a regnode that restarts starts from zero: what a key registered
//     before the restart is not counted against it until it registers
//     again (its lease keeper's next re-Register, when a lease is lost, is
//     counted as new). The cap bounds what a key can add from the moment a
//     regnode starts, never less than it holds;
//   - a Register whose etcd call failed ambiguously (a timeout after the
//     write landed) is not counted: the count errs low, never refusing a
//     caller for a registration it does not hold.

// RegistrationRetry is the retry hint of a refusal for the registrations
// cap: the default lease TTL, the longest a registration abandoned
// without a Deregister goes on holding a slot once its keep-alives stop.
const RegistrationRetry = 10 * time.Second

// Instance names one registration's record: service and id.
type Instance struct{ Service, ID string }

func (i Instance) String() string { return i.Service + "/" + i.ID }

// hold is a registration this regnode granted: to which key, under which
// lease, written at which etcd revision.
type hold struct {
	key   string
	lease int64
	rev   int64
}

// Reservation is one Register's claim on a registration slot of its key,
// from before the write until Granted or Cancel (exactly one of them
// counts; later calls do nothing).
type Reservation struct {
	l    *Limiter
	key  string
	inst Instance
	once sync.Once
}

// Reserve claims a slot of key for a Register of inst, or returns an
// *Error when key holds MaxRegistrations already. Replacing a record key
// holds through this regnode is always allowed: it moves the hold, it does
// not add one.
func (l *Limiter) Reserve(key string, inst Instance) (*Reservation, error) {
	l.mu.Lock()
	defer l.mu.Unlock()
	b := l.get(key)
	if h, ok := l.mu.held[inst]; !(ok && h.key == key) && b.registrations >= l.cfg.MaxRegistrations {
		return nil, &Error{Limit: Registrations, Peer: key, RetryAfter: RegistrationRetry,
			Detail: fmt.Sprintf("%d registrations held on this regnode; deregister one, or wait for one to expire", l.cfg.MaxRegistrations)}
	}
	b.registrations++
	return &Reservation{l: l, key: key, inst: inst}, nil
}

// Granted turns the reservation into a hold of the registration etcd
// stored under lease at revision rev. A hold of the same record already
// there (an older registration it replaced) gives its slot back; should
// that one be the newer (a concurrent Register of the same record wrote
// after this one), this reservation's slot is given back instead.
func (r *Reservation) Granted(lease, rev int64) {
	r.once.Do(func() {
		l := r.l
		l.mu.Lock()
		defer l.mu.Unlock()
		if old, ok := l.mu.held[r.inst]; ok {
			if old.rev > rev {
				l.mu.peers[r.key].registrations--
				return
			}
			l.mu.peers[old.key].registrations--
		}
		l.mu.held[r.inst] = hold{key: r.key, lease: lease, rev: rev}
	})
}

// Cancel gives the slot back: the Register wrote nothing.
func (r *Reservation) Cancel() {
	r.once.Do(func() {
		r.l.mu.Lock()
		defer r.l.mu.Unlock()
		r.l.mu.peers[r.key].registrations-- // a key with a reservation is never swept
	})
}

// Ended releases the hold of inst if it was written before rev: the
// record was deleted at rev (a Deregister through this regnode).
func (l *Limiter) Ended(inst Instance, rev int64) {
	l.mu.Lock()
	defer l.mu.Unlock()
	if h, ok := l.mu.held[inst]; ok && h.rev < rev {
		l.release(inst, h)
	}
}

// Lost releases the hold of inst if it is under lease: that lease no
// longer carries the record (a KeepAlive was told so).
func (l *Limiter) Lost(inst Instance, lease int64) {
	l.mu.Lock()
	defer l.mu.Unlock()
	if h, ok := l.mu.held[inst]; ok && h.lease == lease {
		l.release(inst, h)
	}
}

// Sweep releases every hold that view, a consistent view of etcd at
// revision rev, shows ended: the record is gone or under another lease.
// Holds written after rev are left alone (the view has not seen them
// yet). lookup returns the lease inst's record is under, and whether it
// exists. It returns how many holds it released.
//
// lookup runs outside the limiter's lock (a sweep of 16,000 holds made
// every Register wait for 16,000 lookups): a hold granted again while
// the sweep looks (another lease, a later revision) is not released.
func (l *Limiter) Sweep(rev int64, lookup func(Instance) (lease int64, ok bool)) int {
	type held struct {
		inst Instance
		h    hold
	}
	l.mu.Lock()
	due := make([]held, 0, len(l.mu.held))
	for inst, h := range l.mu.held {
		if h.rev <= rev {
			due = append(due, held{inst, h})
		}
	}
	l.mu.Unlock()
	ended := due[:0]
	for _, d := range due {
		if lease, ok := lookup(d.inst); !ok || lease != d.h.lease {
			ended = append(ended, d)
		}
	}
	if len(ended) == 0 {
		return 0
	}
	l.mu.Lock()
	defer l.mu.Unlock()
	n := 0
	for _, d := range ended {
		if h, ok := l.mu.held[d.inst]; ok && h == d.h {
			l.release(d.inst, h)
			n++
		}
	}
	return n
}

// release drops the hold h of inst; l.mu is held.
func (l *Limiter) release(inst Instance, h hold) {
	delete(l.mu.held, inst)
	l.mu.peers[h.key].registrations-- // a key holding registrations is never swept
}

// Held is how many registrations key holds on this regnode, reservations
// of Registers in flight included.
func (l *Limiter) Held(key string) int {
	l.mu.Lock()
	defer l.mu.Unlock()
	if b, ok := l.mu.peers[key]; ok {
		return b.registrations
	}
	return 0
}
