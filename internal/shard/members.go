package shard

import (
	"context"
	"encoding/json"
	"fmt"
	"log/slog"
	"slices"
	"strings"
	"sync"
	"time"

	"go.etcd.io/etcd/api/v3/mvccpb"
	clientv3 "go.etcd.io/etcd/client/v3"
	"google.golang.org/grpc/metadata"
)

// Announcement is the value of a regnode's announcement key: the bare
// name when it has no zone (what regnodes wrote before zones), else JSON;
// Decode reads both.
type Announcement struct {
	Name string `json:"name"`
	Zone string `json:"zone,omitempty"`
}

// Encode is the announcement's value.
func (a Announcement) Encode() string {
	if a.Zone == "" && !strings.HasPrefix(a.Name, "{") {
		return a.Name
	}
	b, _ := json.Marshal(a) // two strings: cannot fail
	return string(b)
}

// Decode reads an announcement's value: JSON, or a bare name.
func Decode(v []byte) Announcement {
	var a Announcement
	if len(v) > 0 && v[0] == '{' && json.Unmarshal(v, &a) == nil {
		return a
	}
	return Announcement{Name: string(v)}
}

// Watcher follows the announcements under a prefix (one etcd watch) and
// publishes each membership as a View. Views only move forward in
// revision.
type Watcher struct {
	cli    *clientv3.Client
	prefix string
	self   string
	log    *slog.Logger

	mu      sync.Mutex
	cur     *View
	changed chan struct{}
}

// NewWatcher follows the announcements under prefix (<prefix>nodes/);
// self is this regnode's announcement key suffix (its advertised address).
func NewWatcher(cli *clientv3.Client, prefix, self string, log *slog.Logger) *Watcher {
	if log == nil {
		log = slog.Default()
	}
	return &Watcher{cli: cli, prefix: prefix, self: self, log: log.With("component", "membership"), changed: make(chan struct{})}
}

// View is the current membership (nil before the first read) and a
// channel closed when it changes.
func (w *Watcher) View() (*View, <-chan struct{}) {
	w.mu.Lock()
	defer w.mu.Unlock()
	return w.cur, w.changed
}

func (w *Watcher) publish(members map[string]Member, rev int64) {
	ms := make([]Member, 0, len(members))
	for _, m := range members {
		// A regnode announces under its session's lease; a key without
		// one (written by hand) is nobody that could probe.
		if m.Lease != 0 {
			ms = append(ms, m)
		}
	}
	slices.SortFunc(ms, func(a, b Member) int { return strings.Compare(a.Key, b.Key) })
	v := &View{Prefix: w.prefix, Rev: rev, Members: ms, Self: -1}
	for i, m := range ms {
		if m.Key == w.self {
			v.Self = i
		}
	}
	w.mu.Lock()
	defer w.mu.Unlock()
	if w.cur != nil && rev <= w.cur.Rev {
		return
	}
	w.cur = v
	close(w.changed)
	w.changed = make(chan struct{})
}

// Run follows the announcements until ctx ends: list, then watch from the
// list's revision; any break lists again (an announcement is small and
// regnodes are few).
func (w *Watcher) Run(ctx context.Context) error {
	for attempt := 0; ; attempt++ {
		err := w.follow(ctx)
		if ctx.Err() != nil {
			return nil
		}
		w.log.Warn("membership watch ended; listing again", "err", err)
		select {
		case <-ctx.Done():
			return nil
		case <-time.After(min(100*time.Millisecond<<min(attempt, 5), 2*time.Second)):
		}
	}
}

func (w *Watcher) follow(ctx context.Context) error {
	resp, err := w.cli.Get(ctx, w.prefix, clientv3.WithPrefix())
	if err != nil {
		return fmt.Errorf("list the regnode announcements: %w", err)
	}
	members := map[string]Member{}
	for _, kv := range resp.Kvs {
		members[string(kv.Key)] = w.member(kv)
	}
	rev := resp.Header.Revision
	w.publish(members, rev)
	// Its own watch stream (clientv3 shares one per context metadata):
	// etcd answers a progress request only once every watcher of a stream
	// is synced, and the regnode's other watchers ask for progress
	// (store.CompactRevision) on the require-leader stream.
	wctx, cancel := context.WithCancel(metadata.AppendToOutgoingContext(clientv3.WithRequireLeader(ctx), "x-registry-watch", "membership"))
	defer cancel()
	for wr := range w.cli.Watch(wctx, w.prefix, clientv3.WithPrefix(), clientv3.WithRev(rev+1)) {
		if err := wr.Err(); err != nil {
			return fmt.Errorf("watch the regnode announcements: %w", err)
		}
		for _, ev := range wr.Events {
			switch ev.Type {
			case mvccpb.PUT:
				members[string(ev.Kv.Key)] = w.member(ev.Kv)
			case mvccpb.DELETE:
				delete(members, string(ev.Kv.Key))
			}
			rev = max(rev, ev.Kv.ModRevision)
		}
		if len(wr.Events) > 0 {
			w.publish(members, rev)
		}
	}
	return fmt.Errorf("watch the regnode announcements: %w", ctx.Err())
}

func (w *Watcher) member(kv *mvccpb.KeyValue) Member {
	a := Decode(kv.Value)
	return Member{Key: strings.TrimPrefix(string(kv.Key), w.prefix), Name: a.Name, Zone: a.Zone, Lease: kv.Lease}
}
