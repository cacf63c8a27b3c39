//go:build !linux

package main

import (
	"fmt"
	"io"
)

// probeTargetsMain is the target child: its listeners need Linux's epoll
// (see probe_targets_linux.go).
func probeTargetsMain(_ io.Reader, stdout io.Writer) int {
	fmt.Fprintln(stdout, "err the probe scenario's targets need Linux")
	return 1
}
