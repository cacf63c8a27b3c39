package main

import (
	"github.com/spf13/cobra"

	"github.com/regcluster/registry/client"
	"github.com/regcluster/registry/internal/render"
	registryv1 "github.com/regcluster/registry/proto/registry/v1"
)

func newServicesCmd(o *options) *cobra.Command {
	return &cobra.Command{
		Use:   "services",
		Short: "List services with their instances counted by state",
		Long: `List every service with its instances counted by lifecycle (serving,
draining; starting with -o wide) and by health (healthy, degraded,
unavailable, unknown). -o json prints an array of objects.`,
		Args: nArgs(0, 0, ""),
		RunE: func(cmd *cobra.Command, _ []string) error {
			insts, err := listInstances(cmd, o, "")
			if err != nil {
				return err
			}
			counts := render.CountServices(insts)
			if o.json() {
				return o.printJSON(counts)
			}
			return render.WriteServices(o.stdout, counts, o.wide())
		},
	}
}

// listInstances lists service (every service when empty), page by page
// at one revision.
func listInstances(cmd *cobra.Command, o *options, service string) ([]*registryv1.Instance, error) {
	c, err := o.connect(nil)
	if err != nil {
		return nil, err
	}
	defer c.Close()
	ctx, cancel := o.callCtx(cmd.Context())
	defer cancel()
	l, err := c.List(ctx, service, client.ListOptions{})
	if err != nil {
		return nil, err
	}
	return l.Instances, nil
}
