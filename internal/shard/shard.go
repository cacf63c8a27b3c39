// Package shard divides the checked instances among the live regnodes,
// so that probing grows with the cluster, and fences each regnode's health
// writes to its own part.
//
// What it guarantees:
//   - Every instance has exactly one owner in a membership: the live
//     regnode (an announcement under <prefix>nodes/, held by its session)
//     that scores highest for it by rendezvous (highest random weight)
//     hashing. A regnode added takes about 1/n of each one's instances; a
//     regnode lost moves only its own instances.
//   - The hash is FNV-1a 64 of the regnode's announcement key and the
//     instance's service/id, mixed by SplitMix64's finalizer: the same in
//     every process and every version, with no seed.
//   - A View's Guard makes a write land only while the writer's view is
//     still the membership: its own announcement is still held by the
//     session it read (a paused regnode whose session expired cannot
//     write), and no announcement has been written since the view's
//     revision (a regnode joined, or one re-announced, and shares moved).
//     A regnode that left only hands its share to others: their writes
//     about their own instances stay valid, and the instances they gain
//     they have not probed yet, so they write nothing about them.
package shard

import (
	"cmp"
	"slices"

	clientv3 "go.etcd.io/etcd/client/v3"
)

// Member is one live regnode, as its announcement says.
type Member struct {
	// Key is the regnode's advertised API address, the suffix of its
	// announcement key: unique among live regnodes, and what the hash
	// uses (a name need not be unique).
	Key string
	// Name and Zone are what the regnode announces.
	Name, Zone string
	// Lease is the session lease holding the announcement.
	Lease int64
}

// View is one membership, read at one etcd revision.
type View struct {
	// Prefix is the announcements' key prefix (<prefix>nodes/).
	Prefix string
	// Rev is the revision the view was read at: no announcement in etcd
	// has a higher mod revision while the view holds.
	Rev int64
	// Members are the live regnodes, sorted by Key.
	Members []Member
	// Self is this regnode's index in Members, -1 if it is not (yet)
	// announced: then it owns nothing.
	Self int
}

// score is the rendezvous weight of member key for instance service/id.
func score(member, service, id string) uint64 {
	const offset, prime = 14695981039346656037, 1099511628211
	h := uint64(offset)
	add := func(s string) {
		for i := 0; i < len(s); i++ {
			h ^= uint64(s[i])
			h *= prime
		}
	}
	add(member)
	h ^= 0xff // a separator no address holds, so "a"+"bc" and "ab"+"c" differ
	h *= prime
	add(service)
	h ^= '/'
	h *= prime
	add(id)
	// SplitMix64's finalizer: FNV's low bits alone spread poorly.
	h ^= h >> 30
	h *= 0xbf58476d1ce4e5b9
	h ^= h >> 27
	h *= 0x94d049bb133111eb
	h ^= h >> 31
	return h
}

// Owner is the member that owns service/id, and false when there is no
// member.
func (v *View) Owner(service, id string) (Member, bool) {
	best, bestScore := -1, uint64(0)
	for i, m := range v.Members {
		if s := score(m.Key, service, id); best < 0 || s > bestScore || (s == bestScore && m.Key < v.Members[best].Key) {
			best, bestScore = i, s
		}
	}
	if best < 0 {
		return Member{}, false
	}
	return v.Members[best], true
}

// Owns reports whether this regnode owns service/id.
func (v *View) Owns(service, id string) bool {
	if v.Self < 0 {
		return false
	}
	o, ok := v.Owner(service, id)
	return ok && o.Key == v.Members[v.Self].Key
}

// Alone reports whether this regnode is the only live one.
func (v *View) Alone() bool { return v.Self >= 0 && len(v.Members) == 1 }

// Confirmers are the other members in the order they are asked to
// confirm a verdict on service/id: those of another zone than zone (the
// asker's) first, each group by rendezvous rank, so that one instance's
// confirmations go to the same regnode while it lives and spread across
// regnodes for different instances.
func (v *View) Confirmers(service, id, zone string) []Member {
	out := make([]Member, 0, len(v.Members))
	for i, m := range v.Members {
		if i != v.Self {
			out = append(out, m)
		}
	}
	slices.SortFunc(out, func(a, b Member) int {
		if ao, bo := a.Zone != zone, b.Zone != zone; ao != bo {
			if ao {
				return -1
			}
			return 1
		}
		return cmp.Compare(score(b.Key, service, id), score(a.Key, service, id))
	})
	return out
}

// Guard is the comparisons a health write carries so that it lands only
// while this view holds (see the package comment); nil when this regnode
// is not a member.
func (v *View) Guard() []clientv3.Cmp {
	if v.Self < 0 {
		return nil
	}
	self := v.Members[v.Self]
	return []clientv3.Cmp{
		clientv3.Compare(clientv3.LeaseValue(v.Prefix+self.Key), "=", clientv3.LeaseID(self.Lease)),
		clientv3.Compare(clientv3.ModRevision(v.Prefix), "<", v.Rev+1).WithPrefix(),
	}
}

// SelfName is this regnode's name in the view ("" if not a member).
func (v *View) SelfName() string {
	if v.Self < 0 {
		return ""
	}
	return v.Members[v.Self].Name
}
