package client

import (
	"syscall"

	"golang.org/x/sys/unix"
)

const canQueryUnread = true

// unreadBytes is the number of bytes in the socket's receive queue that
// the process has not read (SIOCINQ).
func unreadBytes(rc syscall.RawConn) (int, error) {
	var (
		n    int
		qerr error
	)
	if err := rc.Control(func(fd uintptr) { n, qerr = unix.IoctlGetInt(int(fd), unix.SIOCINQ) }); err != nil {
		return 0, err
	}
	return n, qerr
}
