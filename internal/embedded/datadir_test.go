package embedded

import (
	"errors"
	"os"
	"path/filepath"
	"syscall"
	"testing"
)

// Two holders of one data dir are refused at once, in one process as in
// two (flock is per open file); unlocking lets the next one in.
func TestLockDataDirIsExclusive(t *testing.T) {
	dir := filepath.Join(t.TempDir(), "data")
	d, err := LockDataDir(dir)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := LockDataDir(dir); !errors.Is(err, ErrDataDirInUse) {
		t.Fatalf("second lock of %s: %v, want ErrDataDirInUse", dir, err)
	}
	if err := d.Unlock(); err != nil {
		t.Fatal(err)
	}
	d2, err := LockDataDir(dir)
	if err != nil {
		t.Fatalf("lock after unlock: %v", err)
	}
	d2.Unlock()
	if _, err := os.Stat(filepath.Join(dir, LockFileName)); err != nil {
		t.Fatalf("unlock removed the lock file: %v", err)
	}
}

// A backend file held as bbolt holds it is refused the same way.
func TestLockDataDirRefusesHeldBackend(t *testing.T) {
	dir := t.TempDir()
	snap := filepath.Join(dir, "member", "snap")
	if err := os.MkdirAll(snap, 0o700); err != nil {
		t.Fatal(err)
	}
	f, err := os.Create(filepath.Join(snap, "db"))
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	if err := syscall.Flock(int(f.Fd()), syscall.LOCK_EX|syscall.LOCK_NB); err != nil {
		t.Fatal(err)
	}
	if _, err := LockDataDir(dir); !errors.Is(err, ErrDataDirInUse) {
		t.Fatalf("lock with a held backend: %v, want ErrDataDirInUse", err)
	}
	if _, err := os.Stat(filepath.Join(dir, "member", "snap", "db")); err != nil {
		t.Fatalf("refusing removed the holder's data: %v", err)
	}
}

// Discard leaves a directory as it was found; once etcd ran on it, it
// keeps everything.
func TestDiscardRemovesOnlyWhatItCreated(t *testing.T) {
	fresh := filepath.Join(t.TempDir(), "data")
	d, err := LockDataDir(fresh)
	if err != nil {
		t.Fatal(err)
	}
	// etcd began: its member directory is there.
	if err := os.MkdirAll(filepath.Join(fresh, "member", "wal"), 0o700); err != nil {
		t.Fatal(err)
	}
	d.Discard()
	if _, err := os.Stat(fresh); !errors.Is(err, os.ErrNotExist) {
		t.Fatalf("discarded fresh dir still there: %v", err)
	}

	existing := t.TempDir()
	keep := filepath.Join(existing, "keep")
	if err := os.WriteFile(keep, []byte("x"), 0o600); err != nil {
		t.Fatal(err)
	}
	d, err = LockDataDir(existing)
	if err != nil {
		t.Fatal(err)
	}
	if err := os.MkdirAll(filepath.Join(existing, "member", "wal"), 0o700); err != nil {
		t.Fatal(err)
	}
	d.Discard()
	entries, err := os.ReadDir(existing)
	if err != nil || len(entries) != 1 || entries[0].Name() != "keep" {
		t.Fatalf("discarded existing dir holds %v (%v), want only what was there", entries, err)
	}

	used := filepath.Join(t.TempDir(), "data")
	d, err = LockDataDir(used)
	if err != nil {
		t.Fatal(err)
	}
	if err := os.MkdirAll(filepath.Join(used, "member", "wal"), 0o700); err != nil {
		t.Fatal(err)
	}
	d.used = true
	d.Discard()
	if _, err := os.Stat(filepath.Join(used, "member", "wal")); err != nil {
		t.Fatalf("discard removed a member etcd ran: %v", err)
	}
}
