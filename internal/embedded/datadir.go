package embedded

import (
	"errors"
	"fmt"
	"os"
	"path/filepath"
)

// LockFileName is the file in a data directory that the regnode using it
// holds an exclusive flock(2) on. The kernel drops the lock when the holder
// exits, however it exits, so a stale lock file is never in the way. (On
// systems without flock(2) no lock is taken.)
const LockFileName = "regnode.lock"

// DataDir is a data directory this process holds exclusively, from
// LockDataDir until Unlock or Discard.
type DataDir struct {
	path        string
	lock        *os.File
	createdDir  bool // LockDataDir made the directory
	createdLock bool // LockDataDir made the lock file
	noMember    bool // there was no member/ (etcd's own data) at LockDataDir
	used        bool // etcd ran on it: Discard must keep it
}

// LockDataDir creates dir if it does not exist (mode 0700, as etcd wants)
// and takes an exclusive, non-blocking lock on its lock file. It fails at
// once, with an error wrapping ErrDataDirInUse and naming dir, if anyone
// holds the directory: the lock file's holder, or whoever holds etcd's
// backend (member/snap/db), which would otherwise make etcd wait forever.
func LockDataDir(dir string) (*DataDir, error) {
	d := &DataDir{path: dir}
	if _, err := os.Stat(dir); errors.Is(err, os.ErrNotExist) {
		d.createdDir = true
	}
	if err := os.MkdirAll(dir, 0o700); err != nil {
		return nil, fmt.Errorf("create data directory %s: %w", dir, err)
	}
	lockPath := filepath.Join(dir, LockFileName)
	if _, err := os.Stat(lockPath); errors.Is(err, os.ErrNotExist) {
		d.createdLock = true
	}
	f, err := os.OpenFile(lockPath, os.O_RDWR|os.O_CREATE, 0o600)
	if err != nil {
		return nil, fmt.Errorf("open lock file of data directory %s: %w", dir, err)
	}
	if err := tryLock(f); err != nil {
		// Remove nothing: whatever is there may be the holder's.
		f.Close()
		if errors.Is(err, errHeld) {
			return nil, fmt.Errorf("%w: %s is held by another process (%s is locked: is another regnode running on it?)", ErrDataDirInUse, dir, lockPath)
		}
		return nil, fmt.Errorf("lock data directory %s: %w", dir, err)
	}
	d.lock = f
	// What Discard may remove is decided under the lock: a holder that
	// just left may have written here between the checks above and now.
	if entries, err := os.ReadDir(dir); err != nil || len(entries) != 1 {
		d.createdDir = false
	}
	if _, err := os.Stat(filepath.Join(dir, "member")); errors.Is(err, os.ErrNotExist) {
		d.noMember = true
	}
	// etcd's backend takes its own flock on the db file and waits for it
	// forever; whoever holds it (an older regnode, etcdutl, etcd) is found
	// here instead. The probe lock is dropped at once: bbolt takes its own.
	db := filepath.Join(dir, "member", "snap", "db")
	if err := probeLock(db); err != nil {
		d.Discard()
		if errors.Is(err, errHeld) {
			return nil, fmt.Errorf("%w: %s is held by another process (its etcd backend %s is locked: is an etcd or etcdutl using it?)", ErrDataDirInUse, dir, db)
		}
		return nil, fmt.Errorf("data directory %s: check %s: %w", dir, db, err)
	}
	return d, nil
}

// Path is the directory.
func (d *DataDir) Path() string { return d.path }

// Unlock releases the directory and keeps everything in it. The lock file
// stays: removing it would let a third process lock a new file while a
// second still holds the old one.
func (d *DataDir) Unlock() error {
	if d == nil || d.lock == nil {
		return nil
	}
	err := d.lock.Close() // closing the descriptor drops the flock
	d.lock = nil
	if err != nil {
		return fmt.Errorf("unlock data directory %s: %w", d.path, err)
	}
	return nil
}

// Discard releases the directory after a start that failed, leaving it as
// LockDataDir found it: what LockDataDir created (the directory, the lock
// file) is removed, what existed is never touched. Once etcd has run on the
// directory (see Start) Discard only unlocks: a member that ran may have
// voted or acknowledged writes, and wiping it would lose them.
func (d *DataDir) Discard() error {
	if d == nil {
		return nil
	}
	err := d.Unlock()
	if !d.used {
		d.discardCreated()
	}
	return err
}

func (d *DataDir) discardCreated() {
	if d.createdDir {
		os.RemoveAll(d.path)
		return
	}
	if d.noMember {
		os.RemoveAll(filepath.Join(d.path, "member"))
	}
	if d.createdLock {
		os.Remove(filepath.Join(d.path, LockFileName))
	}
}
