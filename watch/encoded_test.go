package watch_test

import (
	"context"
	"testing"
	"time"

	"google.golang.org/protobuf/encoding/protowire"
	"google.golang.org/protobuf/proto"

	"github.com/regcluster/registry/cache"
	"github.com/regcluster/registry/internal/etcdtest"
	registryv1 "github.com/regcluster/registry/proto/registry/v1"
	"github.com/regcluster/registry/record"
)

// checkEncoded asserts that every batch delivered so far forwards, for
// each instance it carries, bytes that decode to that instance (a valid
// record), and nothing else: a snapshot's Encoded parallel to its
// Instances, a put's Encoded its instance, a delete no bytes.
func (f *follower) checkEncoded(t *testing.T) (forwarded int) {
	t.Helper()
	f.mu.Lock()
	defer f.mu.Unlock()
	same := func(where string, in *registryv1.Instance, e []byte) {
		t.Helper()
		if in == nil {
			t.Fatalf("%s: a nil instance delivered", where)
		}
		if err := record.Validate(in); err != nil {
			t.Fatalf("%s: an invalid instance delivered: %v", where, err)
		}
		p := record.ElementPayload(e)
		if p == nil {
			t.Fatalf("%s: %s/%s forwarded without an element (%x)", where, in.Service, in.Id, e)
		}
		var got registryv1.Instance
		if err := proto.Unmarshal(p, &got); err != nil || !proto.Equal(&got, in) {
			t.Fatalf("%s: forwarded bytes decode to %v (%v), the instance is %v", where, &got, err, in)
		}
		forwarded++
	}
	for _, b := range f.batches {
		if b.Snapshot {
			if len(b.Encoded) != len(b.Instances) {
				t.Fatalf("snapshot at %d: %d elements for %d instances", b.Revision, len(b.Encoded), len(b.Instances))
			}
			for i, in := range b.Instances {
				same("snapshot", in, b.Encoded[i])
			}
		}
		for _, ev := range b.Events {
			switch ev.Type {
			case cache.Put:
				same("put", ev.Instance, ev.Encoded)
			default:
				if ev.Encoded != nil || ev.Instance != nil {
					t.Fatalf("delete of %s/%s at %d carries %v / %x", ev.Service, ev.ID, b.Revision, ev.Instance, ev.Encoded)
				}
			}
		}
	}
	return forwarded
}

// The watcher forwards each record's stored bytes with etcd's revisions,
// decoding to exactly the instance it delivers (unknown fields kept), in
// its lists and in its events; junk (not protobuf, or a valid record
// under another record's key) is never forwarded, in a list or as a put.
func TestForwardsStoredBytesNeverJunk(t *testing.T) {
	m := etcdtest.Start(t, false)
	cli := m.Client(t)
	ctx := context.Background()
	raw := func(service, id, version string, extra []byte) []byte {
		b, err := record.Encode(&registryv1.Instance{Service: service, Id: id, Address: "10.0.0.1:80", Version: version, Weight: 100})
		if err != nil {
			t.Fatal(err)
		}
		return append(b, extra...)
	}
	var unknown []byte
	unknown = protowire.AppendTag(unknown, 99, protowire.BytesType)
	unknown = protowire.AppendString(unknown, "a field of a newer schema")
	store := func(key string, v []byte) int64 {
		r, err := cli.Put(ctx, key, string(v))
		if err != nil {
			t.Fatal(err)
		}
		return r.Header.Revision
	}
	for i := range 10 { // pages of 7: the list spans two
		put(t, cli, "orders", "o-"+string(rune('a'+i)), "1")
	}
	store(keys.Instance("orders", "newer"), raw("orders", "newer", "1", unknown))
	store(keys.Instance("orders", "junk"), []byte("\xff\xfe"))
	store(keys.Instance("orders", "elsewhere"), raw("orders", "not-elsewhere", "1", nil))
	f := follow(t, cli, "")
	waitFor(t, 10*time.Second, "the snapshot", func() bool { return f.c.Len() == 11 })
	// Events: a put with unknown fields, junk over a valid record, junk
	// put outright, and a plain put.
	store(keys.Instance("orders", "newer"), raw("orders", "newer", "2", unknown))
	store(keys.Instance("orders", "o-a"), []byte("garbage"))
	store(keys.Instance("orders", "junk2"), []byte{0x0a, 0x05, 'x'})
	store(keys.Instance("orders", "o-b"), raw("orders", "other", "2", nil))
	last := put(t, cli, "orders", "o-c", "2")
	waitFor(t, 10*time.Second, "the puts", func() bool { return f.c.Revision() >= last })
	if n := f.checkEncoded(t); n != 11+2 {
		t.Fatalf("%d records forwarded, want the 11 listed and 2 put", n)
	}
	if g, ok := f.c.Get("orders", "newer"); !ok || g.Version != "2" || len(g.ProtoReflect().GetUnknown()) == 0 {
		t.Fatalf("orders/newer = %v (present %v), want version 2 with its unknown field", g, ok)
	}
	if f.junk.Load() != 5 {
		t.Fatalf("%d junk records reported, want 5", f.junk.Load())
	}
}
