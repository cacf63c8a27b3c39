package main

import (
	"context"
	"fmt"

	"github.com/spf13/cobra"

	"github.com/regcluster/registry/internal/view"
	registryv1 "github.com/regcluster/registry/proto/registry/v1"
)

func newDrainCmd(o *options) *cobra.Command {
	var reason string
	cmd := &cobra.Command{
		Use:   "drain SERVICE/ID",
		Short: "Mark an instance DRAINING: callers send it no new requests",
		Long: `Mark an instance DRAINING: it stays registered, but callers send it no new
requests until it is undrained. Prints the instance's new lifecycle; -o json
prints the instance.`,
		Example: `  regctl drain orders/orders-7f9c --reason "kernel upgrade"`,
		Args:    nArgs(1, 1, "one argument (SERVICE/ID)"),
		RunE: func(cmd *cobra.Command, args []string) error {
			service, id, err := parseServiceID(args[0])
			if err != nil {
				return err
			}
			return setLifecycle(cmd, o, service, id, func(ctx context.Context, api registryv1.RegistryClient) (*registryv1.Instance, int64, error) {
				resp, err := api.Drain(ctx, &registryv1.DrainRequest{Service: service, Id: id, Reason: reason})
				return resp.GetInstance(), resp.GetRevision(), err
			})
		},
	}
	cmd.Flags().StringVar(&reason, "reason", "", "why the instance is drained (shown by get and list -o wide)")
	return cmd
}

func newUndrainCmd(o *options) *cobra.Command {
	return &cobra.Command{
		Use:   "undrain SERVICE/ID",
		Short: "Mark an instance SERVING again",
		Long: `Mark an instance SERVING again after a drain. Prints the instance's new
lifecycle; -o json prints the instance.`,
		Args: nArgs(1, 1, "one argument (SERVICE/ID)"),
		RunE: func(cmd *cobra.Command, args []string) error {
			service, id, err := parseServiceID(args[0])
			if err != nil {
				return err
			}
			return setLifecycle(cmd, o, service, id, func(ctx context.Context, api registryv1.RegistryClient) (*registryv1.Instance, int64, error) {
				resp, err := api.Undrain(ctx, &registryv1.UndrainRequest{Service: service, Id: id})
				return resp.GetInstance(), resp.GetRevision(), err
			})
		},
	}
}

// setLifecycle runs a Drain or Undrain call, bounded by --timeout, and
// prints the result.
func setLifecycle(cmd *cobra.Command, o *options, service, id string, call func(context.Context, registryv1.RegistryClient) (*registryv1.Instance, int64, error)) error {
	c, err := o.connect(nil)
	if err != nil {
		return err
	}
	defer c.Close()
	ctx, cancel := o.callCtx(cmd.Context())
	defer cancel()
	inst, rev, err := call(ctx, c.API())
	if err != nil {
		return notFound(err, service, id)
	}
	v := view.NewInstance(inst)
	if o.json() {
		return o.printJSON(v)
	}
	_, err = fmt.Fprintf(o.stdout, "%s/%s %s (revision %d)\n", service, id, v.Lifecycle, rev)
	return err
}

// deregistered is what `deregister -o json` prints.
type deregistered struct {
	Service  string `json:"service"`
	ID       string `json:"id"`
	Deleted  bool   `json:"deleted"`
	Revision int64  `json:"revision"`
}

func newDeregisterCmd(o *options) *cobra.Command {
	return &cobra.Command{
		Use:   "deregister SERVICE/ID",
		Short: "Delete an instance from the registry now",
		Long: `Delete an instance from the registry now and revoke its lease, without
draining first. A process still keeping it registered will register it
again; stop that process instead to remove it gracefully.`,
		Args: nArgs(1, 1, "one argument (SERVICE/ID)"),
		RunE: func(cmd *cobra.Command, args []string) error {
			service, id, err := parseServiceID(args[0])
			if err != nil {
				return err
			}
			c, err := o.connect(nil)
			if err != nil {
				return err
			}
			defer c.Close()
			ctx, cancel := o.callCtx(cmd.Context())
			defer cancel()
			resp, err := c.API().Deregister(ctx, &registryv1.DeregisterRequest{Service: service, Id: id})
			if err != nil {
				return notFound(err, service, id)
			}
			if !resp.GetDeleted() {
				return &notFoundError{service: service, id: id}
			}
			if o.json() {
				return o.printJSON(deregistered{Service: service, ID: id, Deleted: true, Revision: resp.GetRevision()})
			}
			_, err = fmt.Fprintf(o.stdout, "%s/%s deregistered (revision %d)\n", service, id, resp.GetRevision())
			return err
		},
	}
}
