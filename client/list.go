package client

import (
	"context"
	"fmt"

	registryv1 "github.com/regcluster/registry/proto/registry/v1"
)

// Listing is the whole of one List, every page read at one revision.
type Listing struct {
	Instances []*registryv1.Instance
	Revision  int64
	Epoch     string
	// Skipped counts junk records the regnodes skipped, over all pages.
	Skipped int64
	// Pages is the number of pages read (of the listing that completed).
	Pages int
}

// ListOptions tune List.
type ListOptions struct {
	// PageSize is asked of the regnode for each page (0: its default).
	PageSize int32
	// Restarts bounds how many times a listing whose revision expired
	// (compacted, or etcd restored, between two pages) starts over
	// (default 3).
	Restarts int
}

// List reads every instance of service ("" for every service) page by
// page, all at the revision of the first page, so the result is one state
// of etcd whatever its size. A listing whose revision expires between
// pages starts over from the first page, up to opts.Restarts times.
func (c *Client) List(ctx context.Context, service string, opts ListOptions) (*Listing, error) {
	if opts.Restarts <= 0 {
		opts.Restarts = 3
	}
	for restart := 0; ; restart++ {
		l, err := c.list(ctx, service, opts.PageSize)
		if err != nil && reason(err) == reasonPageTokenExpired && restart < opts.Restarts {
			c.log.Debug("listing expired between pages; starting over", "service", service, "err", err)
			continue
		}
		return l, err
	}
}

func (c *Client) list(ctx context.Context, service string, pageSize int32) (*Listing, error) {
	l := &Listing{}
	req := &registryv1.ListRequest{Service: service, PageSize: pageSize}
	for {
		resp, err := c.api.List(ctx, req)
		if err != nil {
			return nil, FromStatus(err)
		}
		if l.Pages == 0 {
			l.Revision, l.Epoch = resp.Revision, resp.Epoch
		} else if resp.Revision != l.Revision {
			return nil, fmt.Errorf("list %q: page %d at revision %d, the listing is at %d", service, l.Pages+1, resp.Revision, l.Revision)
		}
		l.Pages++
		l.Instances = append(l.Instances, resp.Instances...)
		l.Skipped += resp.Skipped
		if resp.NextPageToken == "" {
			return l, nil
		}
		req.PageToken = resp.NextPageToken
	}
}
