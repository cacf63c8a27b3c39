package prober

import (
	clientv3 "go.etcd.io/etcd/client/v3"
)

// Share is the part of the instances a prober probes and writes, and the
// fence its writes carry.
type Share struct {
	// Rev is the etcd revision the share was decided at: the prober
	// follows it only once its view has reached Rev, so that the view
	// holds every write of the instances' previous owner.
	Rev int64
	// Owns reports whether service/id is in the share.
	Owns func(service, id string) bool
	// Guard is what every health write compares: it lands only while the
	// share holds.
	Guard []clientv3.Cmp
	// Alone: no other regnode is live, so a verdict needs no other
	// regnode's confirmation.
	Alone bool
	// Fence is written in Health.fence: the revision of the leader key or
	// of the membership the write was made under.
	Fence int64
}

// Shares tells a prober its share as it moves.
type Shares interface {
	// Share is the current share (nil: none yet) and a channel closed
	// when it changes. It may be called from several goroutines.
	Share() (*Share, <-chan struct{})
}

// fixed is a share that never moves: the leader's, everything.
type fixed struct{ s *Share }

func (f fixed) Share() (*Share, <-chan struct{}) { return f.s, nil }
