//go:build !unix

package embedded

import (
	"errors"
	"os"
)

// errHeld means someone else holds the lock.
var errHeld = errors.New("held by another process")

// tryLock takes no lock where flock(2) does not exist: the data directory
// is then not protected from a second regnode.
func tryLock(*os.File) error { return nil }

// probeLock finds no holder where flock(2) does not exist.
func probeLock(string) error { return nil }
