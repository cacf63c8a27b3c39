package node_test

import (
	"context"
	"fmt"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/credentials/insecure"
	healthpb "google.golang.org/grpc/health/grpc_health_v1"
	"google.golang.org/grpc/status"

	"github.com/regcluster/registry/internal/embedded"
	"github.com/regcluster/registry/internal/etcdtest"
	"github.com/regcluster/registry/internal/node"
	registryv1 "github.com/regcluster/registry/proto/registry/v1"
)

// Every long-lived part of a regnode is started through its stopper, in
// the order whose reverse is Close's (see the package doc): the API and
// health last, so they stop first; the lease pool, the etcd client, the
// member and the data dir first, so they close last; the announcement, the
// election, the hub, xDS and the HTTP API's connection quiesced. Close twice is
// safe and leaves nothing running (goleak in TestMain).
// The zero Config is what regnode runs: the txn batcher (group commit) is
// among its parts.
func TestStopperOwnsEveryPart(t *testing.T) {
	n := startEmbedded(t, node.Config{Auth: true}, "http")
	want := []string{
		"data dir", "embedded etcd", "etcd client",
		"lease renewer", "lease pool", "txn batcher",
		"fan-out (quiesce)", "callers' reports", "probe checker", "prober election (quiesce)",
		"token cache", "API listener", "announcement (quiesce)",
		"membership", "canaries", "prober (quiesce)",
		"registration sweeper", "xDS (quiesce)", "API server",
		"metrics listener", "HTTP API's connection (quiesce)", "metrics server",
		"health",
	}
	if got := n.Components(); !slices.Equal(got, want) {
		t.Fatalf("components in start order:\n got %q\nwant %q", got, want)
	}
	for i := range 2 {
		if err := n.Close(); err != nil {
			t.Fatalf("Close %d: %v", i+1, err)
		}
	}
	if got := n.Components(); len(got) != 0 {
		t.Fatalf("components after Close: %q", got)
	}
}

// A start that fails late (the admin token file cannot be written, once
// etcd, the lease pool, the hub and the election run) stops what it
// started: the data dir is unlocked (a regnode starts on it next) and no
// goroutine is left (goleak in TestMain).
func TestFailedStartStopsWhatStarted(t *testing.T) {
	dir := t.TempDir()
	notDir := filepath.Join(t.TempDir(), "file")
	if err := os.WriteFile(notDir, nil, 0o600); err != nil {
		t.Fatal(err)
	}
	cfg := func() node.Config {
		return node.Config{Listen: "127.0.0.1:0", MetricsListen: "off", Logger: quietLog, ShutdownGrace: 200 * time.Millisecond,
			Embed: embedded.Config{Name: "n1", Dir: dir, UnsafeNoFsync: true, LogLevel: "error",
				ListenClientURLs: []string{fmt.Sprintf("http://127.0.0.1:%d", etcdtest.FreePort(t))},
				ListenPeerURLs:   []string{fmt.Sprintf("http://127.0.0.1:%d", etcdtest.FreePort(t))}}}
	}
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	bad := cfg()
	bad.Auth, bad.AdminTokenFile = true, filepath.Join(notDir, "admin-token")
	if n, err := node.Start(ctx, bad); err == nil || !strings.Contains(err.Error(), "first admin token") {
		if n != nil {
			n.Close()
		}
		t.Fatalf("start with an admin token file under a file: %v, want it refused", err)
	}
	n, err := node.Start(ctx, cfg())
	if err != nil {
		t.Fatalf("start on the data dir a failed start left: %v", err)
	}
	if err := n.Close(); err != nil {
		t.Fatal(err)
	}
}

// What Close's order is for, seen from clients: health watchers are told
// NOT_SERVING while the API still serves, and a Watch stream is ended by
// the hub (quiesced first), with the status that sends subscribers to
// another regnode, not cut when the API's grace runs out.
func TestCloseOrderAsClientsSeeIt(t *testing.T) {
	n := startEmbedded(t, node.Config{}, "http")
	cc, err := grpc.NewClient(n.Addr(), grpc.WithTransportCredentials(insecure.NewCredentials()))
	if err != nil {
		t.Fatal(err)
	}
	defer cc.Close()
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	w, err := registryv1.NewRegistryClient(cc).Watch(ctx, &registryv1.WatchRequest{})
	if err != nil {
		t.Fatal(err)
	}
	if _, err := w.Recv(); err != nil { // the first snapshot
		t.Fatalf("Watch: %v", err)
	}
	h, err := healthpb.NewHealthClient(cc).Watch(ctx, &healthpb.HealthCheckRequest{Service: registryv1.Registry_ServiceDesc.ServiceName})
	if err != nil {
		t.Fatal(err)
	}
	if r, err := h.Recv(); err != nil || r.Status != healthpb.HealthCheckResponse_SERVING {
		t.Fatalf("health watch before Close: %v, %v", r, err)
	}
	closed := make(chan error, 1)
	go func() { closed <- n.Close() }()
	if r, err := h.Recv(); err != nil || r.Status != healthpb.HealthCheckResponse_NOT_SERVING {
		t.Fatalf("health watch at Close: %v, %v; want NOT_SERVING before the API stops", r, err)
	}
	for {
		_, err := w.Recv()
		if err == nil {
			continue
		}
		if status.Code(err) != codes.Unavailable || !strings.Contains(status.Convert(err).Message(), "regnode is stopping") {
			t.Fatalf("Watch at Close: %v; want Unavailable, regnode is stopping (the hub ends it)", err)
		}
		break
	}
	if err := <-closed; err != nil {
		t.Fatalf("Close: %v", err)
	}
}
