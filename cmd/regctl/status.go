package main

import (
	"github.com/spf13/cobra"

	"github.com/regcluster/registry/internal/render"
	registryv1 "github.com/regcluster/registry/proto/registry/v1"
)

func newStatusCmd(o *options) *cobra.Command {
	return &cobra.Command{
		Use:   "status",
		Short: "Show the regnode, its etcd cluster and instance counts",
		Long: `Show the regnode that answered, the prober leader ("-" when none), the etcd
revision and compact revision, the cluster id, the epoch (the etcd history
followed: it changes when etcd is restored from a backup) and members (with
the etcd leader), the instances counted by state, and every announced
regnode's prober: its share of the checked instances (OWNED), its probe
rate, the evictions another regnode did not confirm (DISAGREEMENTS), the
demotions it held back (HELD: failing canaries, the mass-demotion limit)
and its canaries. The prober leader only sweeps orphaned saved states:
every regnode probes its share. -o wide adds the members' peer URLs.
-o json prints one object:

  {"node","leader","revision","compact_revision","members":[{"id","name",
   "peer_urls","client_urls","is_leader","is_learner"}],"cluster_id",
   "epoch","counts":{...},"junk_skipped","embedded","etcd_version","version",
   "probing":[{"node","address","zone","owned","probes","probes_per_second",
   "disagreements","held","canary","members","error"}]}`,
		Args: nArgs(0, 0, ""),
		RunE: func(cmd *cobra.Command, _ []string) error {
			c, err := o.connect(nil)
			if err != nil {
				return err
			}
			defer c.Close()
			ctx, cancel := o.callCtx(cmd.Context())
			defer cancel()
			resp, err := c.API().Status(ctx, &registryv1.StatusRequest{Peers: true})
			if err != nil {
				return err
			}
			v := render.NewStatus(resp)
			if o.json() {
				return o.printJSON(v)
			}
			return render.WriteStatus(o.stdout, v, o.wide())
		},
	}
}
