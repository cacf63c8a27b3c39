package server_test

import (
	"context"
	"fmt"
	"strings"
	"testing"
	"time"

	clientv3 "go.etcd.io/etcd/client/v3"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/proto"

	"github.com/regcluster/registry/client"
	"github.com/regcluster/registry/internal/chunk"
	"github.com/regcluster/registry/internal/epoch"
	"github.com/regcluster/registry/internal/etcdtest"
	"github.com/regcluster/registry/internal/regnodetest"
	"github.com/regcluster/registry/internal/server"
	registryv1 "github.com/regcluster/registry/proto/registry/v1"
	"github.com/regcluster/registry/record"
)

// bigInstance is a valid record of about 14 KiB.
func bigInstance(service string, i int) *registryv1.Instance {
	in := inst(service, fmt.Sprintf("b-%04d", i))
	in.Lifecycle = registryv1.Lifecycle_LIFECYCLE_SERVING
	for k := range 14 {
		in.Metadata[fmt.Sprintf("blob%02d", k)] = strings.Repeat(string(rune('a'+k)), 1000)
	}
	return in
}

// putBig writes n big records of service straight into etcd.
func putBig(t testing.TB, cli *clientv3.Client, prefix, service string, from, n int) int64 {
	t.Helper()
	keys := record.NewKeys(prefix)
	var rev int64
	for i := from; i < from+n; i++ {
		b, err := record.Encode(bigInstance(service, i))
		if err != nil {
			t.Fatal(err)
		}
		r, err := cli.Put(context.Background(), keys.Instance(service, fmt.Sprintf("b-%04d", i)), string(b))
		if err != nil {
			t.Fatal(err)
		}
		rev = r.Header.Revision
	}
	return rev
}

// List pages are bounded by bytes and every page of a listing is read at
// the first page's revision, whatever is written in between; a compacted
// listing fails with PAGE_TOKEN_EXPIRED; the SDK pages for its caller.
func TestListPagedAtOneRevision(t *testing.T) {
	m := etcdtest.Start(t, false)
	rn := regnodetest.StartExternal(t, m.ClientURL)
	putBig(t, rn.Etcd, rn.Prefix, "bigsvc", 0, 300)
	c := newClient(t, rn.Addr)
	api, ctx := c.API(), context.Background()

	var (
		rev   int64
		got   int
		pages int
		req   = &registryv1.ListRequest{Service: "bigsvc"}
		token string
	)
	for {
		resp, err := api.List(ctx, req)
		if err != nil {
			t.Fatalf("page %d: %v", pages+1, err)
		}
		pages++
		if sz := proto.Size(resp); sz > chunk.MaxBytes+1024 {
			t.Fatalf("page %d is %d bytes, over the bound", pages, sz)
		}
		if pages == 1 {
			rev = resp.Revision
			if resp.Epoch == "" {
				t.Fatal("no epoch on the listing")
			}
		} else if resp.Revision != rev {
			t.Fatalf("page %d at revision %d, the first at %d", pages, resp.Revision, rev)
		}
		got += len(resp.Instances)
		// Writes between pages are not part of the listing.
		putBig(t, rn.Etcd, rn.Prefix, "bigsvc", 1000+2*pages, 2)
		if resp.NextPageToken == "" {
			break
		}
		token, req.PageToken = resp.NextPageToken, resp.NextPageToken
	}
	if got != 300 || pages < 4 {
		t.Fatalf("listed %d instances in %d pages, want 300 in at least 4 (~4 MiB)", got, pages)
	}

	// The SDK pages by itself and sees everything now in etcd.
	l, err := c.List(ctx, "bigsvc", client.ListOptions{PageSize: 50})
	if err != nil {
		t.Fatal(err)
	}
	if len(l.Instances) != 300+2*pages || l.Pages < 7 {
		t.Fatalf("SDK listed %d instances in %d pages, want %d", len(l.Instances), l.Pages, 300+2*pages)
	}

	// Bad page requests name their field.
	for _, bad := range []struct {
		req   *registryv1.ListRequest
		field string
	}{
		{&registryv1.ListRequest{Service: "bigsvc", PageSize: -1}, "page_size"},
		{&registryv1.ListRequest{Service: "bigsvc", PageToken: "not-a-token"}, "page_token"},
		{&registryv1.ListRequest{Service: "other", PageToken: token}, "page_token"},
	} {
		_, err := api.List(ctx, bad.req)
		if status.Code(err) != codes.InvalidArgument || !strings.Contains(err.Error(), bad.field) {
			t.Errorf("List(%v) = %v, want InvalidArgument naming %s", bad.req, err, bad.field)
		}
	}

	// etcd on another epoch (restored) since the first page: the same.
	if _, err := rn.Etcd.Put(ctx, epoch.Key(rn.Prefix), "restored"); err != nil {
		t.Fatal(err)
	}
	_, err = api.List(ctx, &registryv1.ListRequest{Service: "bigsvc", PageToken: token})
	if status.Code(err) != codes.Aborted || server.Reason(err) != server.ReasonPageTokenExpired {
		t.Fatalf("a page of a listing of another epoch: %v, want Aborted with %s", err, server.ReasonPageTokenExpired)
	}

	// Compacted past the listing's revision: a clear error to restart on.
	head, err := rn.Etcd.Get(ctx, "x")
	if err != nil {
		t.Fatal(err)
	}
	if _, err := rn.Etcd.Compact(ctx, head.Header.Revision); err != nil {
		t.Fatal(err)
	}
	_, err = api.List(ctx, &registryv1.ListRequest{Service: "bigsvc", PageToken: token})
	if status.Code(err) != codes.Aborted || server.Reason(err) != server.ReasonPageTokenExpired {
		t.Fatalf("a page of a compacted listing: %v, want Aborted with %s", err, server.ReasonPageTokenExpired)
	}
}

// A Watch snapshot of ~4 MiB arrives in chunks of at most chunk.MaxBytes,
// all at one revision and epoch; a subscriber of an epoch etcd has left
// gets a new-epoch reset; one ahead of the regnode on its epoch gets
// OutOfRange with REVISION_AHEAD once the regnode's catch-up wait is over.
func TestWatchChunksEpochAndAhead(t *testing.T) {
	m := etcdtest.Start(t, false)
	rn := regnodetest.StartExternal(t, m.ClientURL)
	last := putBig(t, rn.Etcd, rn.Prefix, "bigsvc", 0, 300)
	api := newClient(t, rn.Addr).API()
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	rn.WaitRevision(t, last)

	ep, _, err := epoch.Read(ctx, rn.Etcd, epoch.Key(rn.Prefix))
	if err != nil || ep == "" || ep != rn.Node.Hub().Epoch() {
		t.Fatalf("epoch in etcd %q (%v), the hub's %q", ep, err, rn.Node.Hub().Epoch())
	}
	st, err := api.Status(ctx, &registryv1.StatusRequest{})
	if err != nil || st.Epoch != ep {
		t.Fatalf("Status epoch %q (%v), want %q", st.GetEpoch(), err, ep)
	}

	// snapshot receives one whole snapshot and returns its chunks.
	snapshot := func(ws registryv1.Registry_WatchClient) []*registryv1.WatchResponse {
		t.Helper()
		var chunks []*registryv1.WatchResponse
		for {
			r, err := ws.Recv()
			if err != nil {
				t.Fatal(err)
			}
			if r.GetSnapshot() == nil {
				t.Fatalf("chunk %d is a %T, want a snapshot", len(chunks)+1, r.Kind)
			}
			if sz := proto.Size(r); sz > chunk.MaxBytes {
				t.Fatalf("chunk %d is %d bytes, over %d", len(chunks)+1, sz, chunk.MaxBytes)
			}
			chunks = append(chunks, r)
			if !r.GetSnapshot().More {
				return chunks
			}
		}
	}
	ws, err := api.Watch(ctx, &registryv1.WatchRequest{Service: "bigsvc"})
	if err != nil {
		t.Fatal(err)
	}
	chunks := snapshot(ws)
	n := 0
	for _, c := range chunks {
		if c.Revision != chunks[0].Revision || c.Epoch != ep {
			t.Fatalf("chunk at %d/%q, first at %d, epoch %q", c.Revision, c.Epoch, chunks[0].Revision, ep)
		}
		n += len(c.GetSnapshot().Instances)
	}
	if n != 300 || len(chunks) < 4 {
		t.Fatalf("snapshot of %d instances in %d chunks, want 300 in at least 4", n, len(chunks))
	}

	// From a revision of an epoch etcd no longer has: a new-epoch reset.
	old, err := api.Watch(ctx, &registryv1.WatchRequest{Service: "bigsvc", FromRevision: last - 5, Epoch: "gone"})
	if err != nil {
		t.Fatal(err)
	}
	chunks = snapshot(old)
	if s := chunks[0].GetSnapshot(); !s.Reset_ || !s.NewEpoch || chunks[0].Epoch != ep {
		t.Fatalf("resume on a dead epoch: reset=%v new_epoch=%v epoch=%q, want a new-epoch reset on %q", s.Reset_, s.NewEpoch, chunks[0].Epoch, ep)
	}

	// Ahead on the same epoch: wait, then a distinct status.
	ahead, err := api.Watch(ctx, &registryv1.WatchRequest{Service: "bigsvc", FromRevision: last + 1000, Epoch: ep})
	if err != nil {
		t.Fatal(err)
	}
	_, err = ahead.Recv()
	if status.Code(err) != codes.OutOfRange || server.Reason(err) != server.ReasonRevisionAhead {
		t.Fatalf("resume ahead of the regnode: %v, want OutOfRange with %s", err, server.ReasonRevisionAhead)
	}

	// etcd moves to another epoch (a regnode elsewhere saw a restore):
	// this regnode follows within its check interval and resets the open
	// stream with a new-epoch snapshot.
	if _, err := rn.Etcd.Put(ctx, epoch.Key(rn.Prefix), "e2"); err != nil {
		t.Fatal(err)
	}
	for {
		r, err := ws.Recv()
		if err != nil {
			t.Fatal(err)
		}
		if s := r.GetSnapshot(); s != nil {
			if !s.NewEpoch || !s.Reset_ || r.Epoch != "e2" {
				t.Fatalf("after the epoch moved: snapshot new_epoch=%v reset=%v epoch=%q", s.NewEpoch, s.Reset_, r.Epoch)
			}
			break
		}
		if r.Epoch != ep {
			t.Fatalf("a %T of epoch %q before the new-epoch reset", r.Kind, r.Epoch)
		}
	}
	if rn.Node.Hub().Epoch() != "e2" {
		t.Fatalf("hub epoch %q, want e2", rn.Node.Hub().Epoch())
	}
}
