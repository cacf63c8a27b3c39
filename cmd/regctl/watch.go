package main

import (
	"context"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"os"
	"os/signal"
	"sync"
	"syscall"
	"time"

	"github.com/spf13/cobra"

	"github.com/regcluster/registry/client"
	"github.com/regcluster/registry/internal/render"
)

func newWatchCmd(o *options) *cobra.Command {
	var progress bool
	cmd := &cobra.Command{
		Use:   "watch [SERVICE]",
		Short: "Follow the changes to instances, of one service or of all",
		Long: `Follow the instances of SERVICE (or of every service) and print one line
per change, until interrupted (SIGINT or SIGTERM, exit 0).

It starts with a snapshot of the current state, then prints every put and
delete with the etcd revision it happened at. The revision printed never
goes down: watch resumes by itself on any of --endpoints when a regnode
stops or a connection breaks, from the last revision it printed. When it
cannot catch up (the revision was compacted, or it fell too far behind) it
prints a RESET with the whole new state; NEW EPOCH means etcd itself was
restored or replaced and revisions start over.

Table form (the default; -o wide adds zone, weight, version, lease,
mod_rev, reason and metadata to puts):

  REV 1234  SNAPSHOT  2 instances
  REV 1234  SNAPSHOT  orders/o-1  10.0.0.1:80  SERVING  HEALTHY
  REV 1234  SNAPSHOT  orders/o-2  10.0.0.2:80  SERVING  HEALTHY
  REV 1240  PUT  orders/o-1  10.0.0.1:80  DRAINING  HEALTHY
  REV 1241  DELETE  orders/o-1
  REV 1300  RESET  1 instance
  REV 1300  PROGRESS                       (only with --progress)

-o json prints one JSON object per line:

  {"type":"snapshot","revision":R,"reset":false,"instances":[...]}   first, and on every reset (with "reset":true)
  {"type":"put","revision":R,"instance":{...}}
  {"type":"delete","revision":R,"service":S,"id":I}
  {"type":"progress","revision":R}                                   always, so a consumer sees its revision move

If no regnode answers within --timeout, watch says so on stderr and keeps
trying; it says so again if it loses every regnode for longer than that.
When no regnode has confirmed the view for more than 3s (the SDK's
receive deadline: the regnode it follows is paused, hung or cut off),
watch warns on stderr while it moves to another regnode, and says when
the view is current again.`,
		Example: "  regctl watch\n  regctl watch orders -o wide\n  regctl watch orders -o json | jq -c .",
		Args:    nArgs(0, 1, "one argument (SERVICE)"),
		RunE: func(cmd *cobra.Command, args []string) error {
			service := ""
			if len(args) == 1 {
				var err error
				if service, err = parseService(args[0]); err != nil {
					return err
				}
			}
			return runWatch(cmd.Context(), o, service, progress)
		},
	}
	cmd.Flags().BoolVar(&progress, "progress", false, "also print progress lines (the revision moved with no change) in table form; -o json always does")
	return cmd
}

// lockedWriter serializes writes to one stream from several goroutines.
type lockedWriter struct {
	mu sync.Mutex
	w  io.Writer
}

func (l *lockedWriter) Write(p []byte) (int, error) {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.w.Write(p)
}

// watchPrinter turns the subscription's changes into lines on stdout. It
// runs on the subscription's goroutine, one change at a time.
type watchPrinter struct {
	o        *options
	stderr   io.Writer
	progress bool
	snapped  bool // the first snapshot was printed

	// failed is called once with the first write error.
	failed func(error)
	err    error
}

func (p *watchPrinter) change(ch client.Change) {
	if p.err != nil {
		return
	}
	if err := p.print(ch); err != nil {
		p.err = fmt.Errorf("writing to stdout: %w", err)
		p.failed(p.err)
	}
}

func (p *watchPrinter) print(ch client.Change) error {
	rev := ch.Revision
	if ch.Snapshot {
		// The first snapshot is the starting state; any later one replaces
		// everything shown so far: a reset. (The SDK's Diff.Reset is set on
		// every snapshot, the first included.)
		reset := p.snapped
		p.snapped = true
		if ch.NewEpoch {
			fmt.Fprintf(p.stderr, "regctl: warning: NEW EPOCH at revision %d: etcd was restored or replaced; revisions start over\n", rev)
		}
		line := render.NewSnapshotLine(rev, reset, ch.NewEpoch, ch.Instances)
		if p.o.json() {
			return p.o.printJSONLine(line)
		}
		if err := p.text(line.Text(p.o.wide())); err != nil {
			return err
		}
		if !reset {
			for _, in := range line.Instances {
				if err := p.text(render.SnapshotMemberText(rev, in, p.o.wide())); err != nil {
					return err
				}
			}
			return nil
		}
		// After a reset, the net changes from what was shown.
		for _, l := range render.NewDiffLines(ch.Diff) {
			if err := p.text(l.Text(p.o.wide())); err != nil {
				return err
			}
		}
		return nil
	}
	lines := render.NewDiffLines(ch.Diff)
	if len(lines) == 0 {
		// Nothing changed but the revision (a progress notification, or
		// events whose net effect is nil).
		if !p.o.json() && !p.progress {
			return nil
		}
		lines = []render.WatchLine{render.NewProgressLine(rev)}
	}
	for _, l := range lines {
		var err error
		if p.o.json() {
			err = p.o.printJSONLine(l)
		} else {
			err = p.text(l.Text(p.o.wide()))
		}
		if err != nil {
			return err
		}
	}
	return nil
}

func (p *watchPrinter) text(s string) error {
	_, err := io.WriteString(p.o.stdout, s+"\n")
	return err
}

// runWatch follows service ("" for all) until a signal or ctx ends.
func runWatch(ctx context.Context, o *options, service string, progress bool) error {
	ctx, stop := signal.NotifyContext(ctx, os.Interrupt, syscall.SIGTERM)
	defer stop()

	stderr := &lockedWriter{w: o.stderr}
	// The SDK logs at error level only what a person should see (a regnode
	// refusing the subscription); its retries are reported below.
	c, err := o.connect(slog.New(slog.NewTextHandler(stderr, &slog.HandlerOptions{Level: slog.LevelError})))
	if err != nil {
		return err
	}
	defer c.Close()

	ctx, cancel := context.WithCancelCause(ctx)
	defer cancel(nil)
	p := &watchPrinter{o: o, stderr: stderr, progress: progress, failed: cancel}
	sub, err := c.Subscribe(ctx, service, client.SubscribeOptions{OnChange: p.change})
	if err != nil {
		return err
	}
	defer sub.Close()

	name := "every service"
	if service != "" {
		name = fmt.Sprintf("%q", service)
	}
	lastErr := func() string {
		if err := sub.LastError(); err != nil {
			return ": " + describe(err, o)
		}
		return ""
	}

	// Before the first snapshot: one warning after --timeout.
	start := time.NewTimer(o.timeout)
	defer start.Stop()
	select {
	case <-sub.Ready():
	case <-ctx.Done():
		return watchEnd(ctx, sub)
	case <-start.C:
		fmt.Fprintf(stderr, "regctl: warning: no regnode at %s answered within %s (--timeout); still trying to watch %s%s\n",
			o.endpointList(), o.timeout, name, lastErr())
		select {
		case <-sub.Ready():
		case <-ctx.Done():
			return watchEnd(ctx, sub)
		}
	}

	// Then: one warning when the view has not been confirmed by a regnode
	// for longer than the SDK's receive deadline (a paused regnode, a
	// half-open connection: the SDK is moving to another), one when every
	// regnode has been out of reach for longer than --timeout, and one
	// line when the view is current again.
	deadline := client.DefaultReceiveDeadline
	tick := time.NewTicker(min(max(o.timeout/4, 10*time.Millisecond), deadline/4))
	defer tick.Stop()
	var (
		downSince   time.Time
		lost, stale bool
	)
	for {
		select {
		case <-ctx.Done():
			return watchEnd(ctx, sub)
		case now := <-tick.C:
			f := sub.Freshness()
			current := f.Connected && now.Sub(f.ConfirmedAt) <= deadline
			if current {
				if lost || stale {
					fmt.Fprintf(stderr, "regctl: watching again: the view is current at revision %d\n", f.Revision)
				}
				downSince, lost, stale = time.Time{}, false, false
				continue
			}
			if !stale && now.Sub(f.ConfirmedAt) > deadline {
				stale = true
				fmt.Fprintf(stderr, "regctl: warning: the view has not been confirmed by a regnode for more than %s (last at revision %d, %s); resuming on another regnode%s\n",
					deadline, f.Revision, f.ConfirmedAt.Format(time.TimeOnly), lastErr())
			}
			switch {
			case f.Connected:
			case downSince.IsZero():
				downSince = now
			case !lost && now.Sub(downSince) >= o.timeout:
				lost = true
				fmt.Fprintf(stderr, "regctl: warning: lost every regnode at %s for more than %s (--timeout); still trying from revision %d%s\n",
					o.endpointList(), o.timeout, f.Revision, lastErr())
			}
		}
	}
}

// watchEnd stops the subscription once ctx has ended: a signal (or the
// caller's context) is a normal end; a failed write to stdout is not.
func watchEnd(ctx context.Context, sub *client.Subscription) error {
	sub.Close()
	if err := context.Cause(ctx); err != nil && !errors.Is(err, context.Canceled) {
		return err
	}
	return nil
}
