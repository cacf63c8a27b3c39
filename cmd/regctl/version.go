package main

import (
	"fmt"

	"github.com/spf13/cobra"

	"github.com/regcluster/registry/internal/buildinfo"
)

// newVersionCmd prints regctl's own build: it needs no regnode (`regctl
// status` shows the regnodes' versions).
func newVersionCmd(o *options) *cobra.Command {
	return &cobra.Command{
		Use:   "version",
		Short: "Print regctl's module version and VCS revision",
		Long: `Print regctl's module version and the VCS revision it was built from, as
the Go toolchain stamped them into the binary. A binary built with
-buildvcs=false (or outside a git checkout) says its revision is unknown;
'make build' stamps it. With -o json: {"module", "version", "revision",
"time", "modified", "go"}. No regnode is contacted.`,
		Args: nArgs(0, 0, ""),
		RunE: func(*cobra.Command, []string) error {
			in := buildinfo.Read()
			if o.json() {
				return o.printJSON(in)
			}
			_, err := fmt.Fprintf(o.stdout, "regctl %s\n", in)
			return err
		},
	}
}
