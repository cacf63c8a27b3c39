package etcdtest

import (
	"context"
	"io"
	"os"
	"testing"
	"time"

	clientv3 "go.etcd.io/etcd/client/v3"
	"go.etcd.io/etcd/etcdutl/v3/snapshot"
	"go.uber.org/zap"
)

// SaveSnapshot writes a snapshot of the member cli reaches (as `etcdctl
// snapshot save` does: Maintenance.Snapshot) to path and returns the
// revision it holds.
func SaveSnapshot(t testing.TB, cli *clientv3.Client, path string) int64 {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	rc, err := cli.Snapshot(ctx)
	if err != nil {
		t.Fatalf("snapshot: %v", err)
	}
	defer rc.Close()
	f, err := os.Create(path)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := io.Copy(f, rc); err != nil {
		f.Close()
		t.Fatalf("snapshot: %v", err)
	}
	if err := f.Close(); err != nil {
		t.Fatal(err)
	}
	st, err := snapshot.NewV3(zap.NewNop()).Status(path)
	if err != nil {
		t.Fatalf("snapshot status: %v", err)
	}
	return st.Revision
}

// Restore is etcd's own restore (`etcdutl snapshot restore`) of the
// snapshot at path into the new data dir of member name, with the same
// peer URL, initial cluster and token as before: the restored cluster keeps
// its cluster id and member ids, and its revision starts again from the
// snapshot's.
func Restore(t testing.TB, path, name, dir, peerURL, initialCluster, token string) {
	t.Helper()
	err := snapshot.NewV3(zap.NewNop()).Restore(snapshot.RestoreConfig{SnapshotPath: path, Name: name, OutputDataDir: dir,
		PeerURLs: []string{peerURL}, InitialCluster: initialCluster, InitialClusterToken: token})
	if err != nil {
		t.Fatalf("restore %s into %s: %v", path, dir, err)
	}
}
