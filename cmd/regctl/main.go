// Command regctl is the registry's operator CLI, in the style of kubectl and
// etcdctl: it lists services and instances, registers an instance from the
// shell, drains, undrains and deregisters instances, follows their changes
// (watch), and shows the status of the regnodes and their etcd cluster.
//
//	regctl [--endpoints host:port,...] [--timeout D] [-o table|wide|json] COMMAND
//
// Endpoints are also read from REGCTL_ENDPOINTS (the flag wins) and default
// to 127.0.0.1:7400. Errors are one line on stderr prefixed "regctl: ";
// the exit code is 2 for a usage error (nothing was sent), 1 for any other
// failure, 0 on success. Run `regctl --help` for the commands.
package main

import (
	"context"
	"os"
)

func main() {
	os.Exit(run(context.Background(), os.Args[1:], os.Stdout, os.Stderr, os.Getenv))
}
