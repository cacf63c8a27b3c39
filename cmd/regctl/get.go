package main

import (
	"time"

	"github.com/spf13/cobra"
	"google.golang.org/grpc/codes"

	"github.com/regcluster/registry/internal/render"
	registryv1 "github.com/regcluster/registry/proto/registry/v1"
)

func newGetCmd(o *options) *cobra.Command {
	return &cobra.Command{
		Use:   "get SERVICE/ID",
		Short: "Show one instance",
		Long: `Show one instance, every field of it, including the reason of its health
verdict. -o json prints one JSON object.`,
		Example: "  regctl get orders/orders-7f9c\n  regctl get orders/orders-7f9c -o json",
		Args:    nArgs(1, 1, "one argument (SERVICE/ID)"),
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
			resp, err := c.API().Get(ctx, &registryv1.GetRequest{Service: service, Id: id})
			if err != nil {
				return notFound(err, service, id)
			}
			v := render.NewInstance(resp.GetInstance())
			if o.json() {
				return o.printJSON(v)
			}
			return render.WriteInstance(o.stdout, v, time.Now())
		},
	}
}

// notFound turns a gRPC NotFound about service/id into "SERVICE/ID not
// found"; other errors are returned as they are.
func notFound(err error, service, id string) error {
	if st, ok := grpcStatus(err); ok && st.Code() == codes.NotFound {
		return &notFoundError{service: service, id: id}
	}
	return err
}
