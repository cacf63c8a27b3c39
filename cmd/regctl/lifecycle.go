package main

import (
	"context"
	"fmt"
	"strings"

	"github.com/spf13/cobra"
	"google.golang.org/protobuf/types/known/durationpb"

	"github.com/regcluster/registry/internal/render"
	registryv1 "github.com/regcluster/registry/proto/registry/v1"
)

func newDrainCmd(o *options) *cobra.Command {
	var (
		reason string
		wait   bool
	)
	cmd := &cobra.Command{
		Use:   "drain SERVICE/ID",
		Short: "Mark an instance DRAINING: callers send it no new requests",
		Long: `Mark an instance DRAINING: it stays registered, but callers send it no new
requests until it is undrained. Prints the instance's new lifecycle; -o json
prints the instance.

--wait then waits, up to --timeout, until every live subscriber of the
service on every regnode has applied the drain: every SDK client (regctl
watch included) acknowledges on its Subscribe stream what it applied. A
Watch stream (an older SDK, Config.WatchPerSubscription, the HTTP API's
watch) cannot acknowledge: it counts once its regnode has sent it the
drain: one whose client stopped reading holds the wait once its regnode's
sends to it block on flow control (after about 128 KiB). At the timeout
it says how many have not, on which regnodes, and exits 1.`,
		Example: `  regctl drain orders/orders-7f9c --reason "kernel upgrade"
  regctl drain orders/orders-7f9c --wait --timeout 30s`,
		Args: nArgs(1, 1, "one argument (SERVICE/ID)"),
		RunE: func(cmd *cobra.Command, args []string) error {
			service, id, err := parseServiceID(args[0])
			if err != nil {
				return err
			}
			var then func(context.Context, registryv1.RegistryClient, int64) error
			if wait {
				then = func(ctx context.Context, api registryv1.RegistryClient, rev int64) error {
					return waitApplied(ctx, o, api, service, rev)
				}
			}
			return setLifecycle(cmd, o, service, id, func(ctx context.Context, api registryv1.RegistryClient) (*registryv1.Instance, int64, error) {
				resp, err := api.Drain(ctx, &registryv1.DrainRequest{Service: service, Id: id, Reason: reason})
				return resp.GetInstance(), resp.GetRevision(), err
			}, then)
		},
	}
	cmd.Flags().StringVar(&reason, "reason", "", "why the instance is drained (shown by get and list -o wide)")
	cmd.Flags().BoolVar(&wait, "wait", false, "wait, up to --timeout, until every live subscriber and xDS client applied the drain")
	return cmd
}

// waitApplied waits up to --timeout for every live subscriber of service
// to apply rev, and says on stderr who has not.
func waitApplied(ctx context.Context, o *options, api registryv1.RegistryClient, service string, rev int64) error {
	// The regnode answers at the timeout; the call gets a margin over it.
	cctx, cancel := context.WithTimeout(ctx, o.timeout+defaultTimeout)
	defer cancel()
	resp, err := api.WaitApplied(cctx, &registryv1.WaitAppliedRequest{Service: service, Revision: rev, Timeout: durationpb.New(o.timeout)})
	if err != nil {
		return fmt.Errorf("wait for the subscribers of %s to apply revision %d: %w", service, rev, err)
	}
	if resp.Done {
		if !o.json() {
			msg := fmt.Sprintf("applied by all %d live subscribers on %d regnodes", resp.Subscribers, len(resp.Nodes))
			if resp.XdsClients > 0 {
				msg = fmt.Sprintf("applied by all %d live subscribers and %s on %d regnodes", resp.Subscribers,
					plural(resp.XdsClients, "xDS client"), len(resp.Nodes))
			}
			if resp.WatchStreams > 0 {
				msg += fmt.Sprintf("; %s cannot acknowledge; sent to all", plural(resp.WatchStreams, "Watch stream"))
			}
			_, err = fmt.Fprintln(o.stdout, msg)
		}
		return err
	}
	var parts []string
	for _, n := range resp.Nodes {
		if n.Error != "" {
			parts = append(parts, fmt.Sprintf("regnode %s (%s) not asked: %s", n.Node, n.Address, n.Error))
			continue
		}
		if n.Pending > 0 {
			var names []string
			for _, l := range n.Laggards {
				names = append(names, fmt.Sprintf("%s (%s, at revision %d)", l.Subscriber, l.Peer, l.Revision))
			}
			parts = append(parts, fmt.Sprintf("regnode %s (%s): %d of %d: %s", n.Node, n.Address, n.Pending, n.Subscribers, strings.Join(names, ", ")))
		}
		if n.XdsPending > 0 {
			var names []string
			for _, l := range n.XdsLaggards {
				names = append(names, fmt.Sprintf("node %s (%s, acknowledged revision %d)", l.Subscriber, l.Peer, l.Revision))
			}
			parts = append(parts, fmt.Sprintf("regnode %s (%s): %d of %d xDS clients: %s", n.Node, n.Address,
				n.XdsPending, n.XdsClients, strings.Join(names, ", ")))
		}
		if n.WatchPending > 0 {
			var names []string
			for _, l := range n.WatchLaggards {
				if l.Subscriber != "" {
					names = append(names, fmt.Sprintf("%s (%s, sent up to revision %d)", l.Subscriber, l.Peer, l.Revision))
				} else {
					names = append(names, fmt.Sprintf("%s (sent up to revision %d)", l.Peer, l.Revision))
				}
			}
			parts = append(parts, fmt.Sprintf("regnode %s (%s): %d of %d Watch streams not sent it: %s", n.Node, n.Address,
				n.WatchPending, n.WatchStreams, strings.Join(names, ", ")))
		}
	}
	var what []string
	if resp.Subscribers > 0 || resp.WatchStreams == 0 {
		what = append(what, fmt.Sprintf("%d of %d live subscribers of %s have not applied revision %d", resp.Pending, resp.Subscribers, service, rev))
	}
	if resp.XdsClients > 0 {
		what = append(what, fmt.Sprintf("%d of %d xDS clients of %s have not acknowledged revision %d", resp.XdsPending, resp.XdsClients, service, rev))
	}
	if resp.WatchStreams > 0 {
		what = append(what, fmt.Sprintf("%d of %d Watch streams of %s (they cannot acknowledge) have not been sent revision %d",
			resp.WatchPending, resp.WatchStreams, service, rev))
	}
	return fmt.Errorf("%s after %s; %s", strings.Join(what, ", and "), o.timeout, strings.Join(parts, "; "))
}

// plural is "1 thing" or "n things".
func plural(n int64, thing string) string {
	if n == 1 {
		return "1 " + thing
	}
	return fmt.Sprintf("%d %ss", n, thing)
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
			}, nil)
		},
	}
}

// setLifecycle runs a Drain or Undrain call, bounded by --timeout, and
// prints the result; then, if set, runs after the print with the
// revision of the write.
func setLifecycle(cmd *cobra.Command, o *options, service, id string, call func(context.Context, registryv1.RegistryClient) (*registryv1.Instance, int64, error),
	then func(context.Context, registryv1.RegistryClient, int64) error) error {
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
	v := render.NewInstance(inst)
	if o.json() {
		err = o.printJSON(v)
	} else {
		_, err = fmt.Fprintf(o.stdout, "%s/%s %s (revision %d)\n", service, id, v.Lifecycle, rev)
	}
	if err != nil || then == nil {
		return err
	}
	return then(cmd.Context(), c.API(), rev)
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
