package main

import "syscall"

// childSysProcAttr puts the child backend in its own process group, so a
// Ctrl-C at the terminal reaches only the parent, which then stops it in
// order; and has the kernel kill it if the parent dies without doing so
// (kill -9 of the demo), so nothing is left running.
func childSysProcAttr() *syscall.SysProcAttr {
	return &syscall.SysProcAttr{Setpgid: true, Pdeathsig: syscall.SIGKILL}
}
