//go:build unix

package embedded

import (
	"errors"
	"os"
	"syscall"
)

// errHeld means someone else holds the lock.
var errHeld = errors.New("held by another process")

// tryLock takes an exclusive flock(2) on f without waiting.
func tryLock(f *os.File) error {
	err := syscall.Flock(int(f.Fd()), syscall.LOCK_EX|syscall.LOCK_NB)
	if errors.Is(err, syscall.EWOULDBLOCK) {
		return errHeld
	}
	return err
}

// probeLock takes and drops an exclusive flock on path, the lock bbolt
// holds on its file; a missing file is not held by anyone.
func probeLock(path string) error {
	f, err := os.Open(path)
	if errors.Is(err, os.ErrNotExist) {
		return nil
	}
	if err != nil {
		return err
	}
	defer f.Close()
	if err := tryLock(f); err != nil {
		return err
	}
	return syscall.Flock(int(f.Fd()), syscall.LOCK_UN)
}
