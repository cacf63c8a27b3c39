package main

import (
	"fmt"
	"time"

	"github.com/spf13/cobra"

	"github.com/regcluster/registry/internal/render"
	registryv1 "github.com/regcluster/registry/proto/registry/v1"
)

func newXDSClientsCmd(o *options) *cobra.Command {
	var local bool
	cmd := &cobra.Command{
		Use:   "clients",
		Short: "List the xDS clients of every regnode: what they follow and acknowledged",
		Long: `List the xDS (ADS) streams the regnodes serve, one row a stream: the regnode
serving it, the client's node id, its kind (grpc or envoy, from its user
agent; other), the services whose endpoints it follows, the revision of
each it acknowledged (ACK), BEHIND: the services whose latest endpoints it
has not acknowledged ("orders 12<15": acknowledged 12, served 15; "no"),
its NACKs (versions it refused) and the last NACK's error. -o wide adds
the stream id, protocol (sotw or delta), the client's address, its user
agent and how long it has been connected.

Every regnode announced is asked, through the one regctl reaches
(--local: that one only). A regnode that cannot be asked is named on
stderr with the error, and the others are listed; regctl exits non-zero
only when the call itself fails. With --auth the token needs read on
every service. -o json prints one object:

  {"nodes":[{"node","address","error","clients":[{"node","stream_id",
   "node_id","kind","user_agent","peer","protocol","services":[{"service",
   "acked_revision","revision","behind"}],"behind","nacks","last_nack",
   "connected"}]}]}`,
		Example: `  regctl xds clients
  regctl xds clients -o wide --local
  regctl xds clients -o json | jq '.nodes[].clients[] | select(.behind)'`,
		Args: nArgs(0, 0, ""),
		RunE: func(cmd *cobra.Command, _ []string) error {
			c, err := o.connect(nil)
			if err != nil {
				return err
			}
			defer c.Close()
			ctx, cancel := o.callCtx(cmd.Context())
			defer cancel()
			resp, err := c.API().XdsClients(ctx, &registryv1.XdsClientsRequest{All: !local})
			if err != nil {
				return err
			}
			v := render.NewXdsClients(resp)
			for _, e := range render.XdsErrors(v) {
				fmt.Fprintf(o.stderr, "regctl: %s\n", e)
			}
			if o.json() {
				return o.printJSON(v)
			}
			return render.WriteXdsClients(o.stdout, v, o.wide(), time.Now())
		},
	}
	cmd.Flags().BoolVar(&local, "local", false, "list the xDS clients of the regnode regctl reaches only")
	return cmd
}
