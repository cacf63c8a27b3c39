package main

import (
	"time"

	"github.com/spf13/cobra"

	"github.com/regcluster/registry/internal/render"
)

func newListCmd(o *options) *cobra.Command {
	return &cobra.Command{
		Use:   "list [SERVICE]",
		Short: "List instances, of one service or of all",
		Long: `List instances, of SERVICE or of every service, sorted by service and id.

Columns: SERVICE ID ADDRESS ZONE WEIGHT LIFECYCLE HEALTH SINCE, where SINCE
is the age of the current health verdict (or of the registration, before
the first probe). -o wide adds VERSION LEASE MOD_REV REASON METADATA.
-o json prints a JSON array of instances ([] when there are none).`,
		Example: "  regctl list\n  regctl list orders -o wide\n  regctl list -o json",
		Args:    nArgs(0, 1, "one argument (SERVICE)"),
		RunE: func(cmd *cobra.Command, args []string) error {
			service := ""
			if len(args) == 1 {
				var err error
				if service, err = parseService(args[0]); err != nil {
					return err
				}
			}
			insts, err := listInstances(cmd, o, service)
			if err != nil {
				return err
			}
			vs := render.NewInstances(insts)
			if o.json() {
				return o.printJSON(vs)
			}
			return render.WriteInstances(o.stdout, vs, o.wide(), time.Now())
		},
	}
}
