//go:build !linux

package main

import "syscall"

// childSysProcAttr: elsewhere the child relies on its stdin closing when
// the parent dies (see childMain).
func childSysProcAttr() *syscall.SysProcAttr { return nil }
