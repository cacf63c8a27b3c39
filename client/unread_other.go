//go:build !linux

package client

import (
	"errors"
	"syscall"
)

// canQueryUnread is false where the Client does not ask the socket: a
// stall is then called on the deadline alone.
const canQueryUnread = false

func unreadBytes(syscall.RawConn) (int, error) {
	return 0, errors.New("unread bytes are not queried on this platform")
}
