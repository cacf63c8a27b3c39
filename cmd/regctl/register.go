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
	"sync/atomic"
	"syscall"
	"time"

	"github.com/spf13/cobra"

	"github.com/regcluster/registry/client"
	"github.com/regcluster/registry/internal/render"
	registryv1 "github.com/regcluster/registry/proto/registry/v1"
	"github.com/regcluster/registry/record"
)

// registerFlags are register's own flags.
type registerFlags struct {
	service, id, address, zone, version string
	weight                              uint32
	meta                                []string
	check                               string
	checkInterval, checkTimeout         time.Duration
	ttl, drainGrace                     time.Duration
}

func newRegisterCmd(o *options) *cobra.Command {
	var f registerFlags
	cmd := &cobra.Command{
		Use:   "register --service S --id I --address H:P [flags]",
		Short: "Register an instance and keep it registered until interrupted",
		Long: `Register an instance and keep it registered in the foreground: the lease is
renewed, and the instance registered again if its lease is lost. On SIGINT
or SIGTERM it drains (lifecycle DRAINING), waits until every live
subscriber of the service has applied the drain (at most --drain-grace),
deregisters and exits 0. A second signal skips the rest
of the grace period; a third exits at once, leaving the instance to expire
with its lease.

The first registration is retried until --timeout. It prints one line when
registered (with -o json, one JSON object per event).

--check tells the elected prober how to probe the instance's --address:
  tcp              TCP connect
  http:PATH        HTTP GET of PATH (e.g. http:/healthz)
  grpc[:SERVICE]   grpc.health.v1.Health/Check of SERVICE (default "")
  none             no check (the default)`,
		Example: `  regctl register --service orders --id orders-1 --address 10.0.0.7:8080 \
      --ttl 10s --weight 100 --meta az=eu-1a --check http:/healthz --zone eu-1a`,
		Args: nArgs(0, 0, ""),
		RunE: func(cmd *cobra.Command, _ []string) error {
			inst, err := f.instance(cmd)
			if err != nil {
				return err
			}
			return runRegister(cmd.Context(), o, inst, f.ttl, f.drainGrace)
		},
	}
	fl := cmd.Flags()
	fl.StringVar(&f.service, "service", "", "service name (required)")
	fl.StringVar(&f.id, "id", "", "instance id, unique in the service (required)")
	fl.StringVar(&f.address, "address", "", "host:port callers reach the instance at (required)")
	fl.StringVar(&f.zone, "zone", "", "zone or failure domain")
	fl.StringVar(&f.version, "version", "", "the instance's software version")
	fl.Uint32Var(&f.weight, "weight", record.DefaultWeight, "load-balancing weight, 1..1000")
	fl.StringArrayVar(&f.meta, "meta", nil, "metadata key=value (repeatable)")
	fl.StringVar(&f.check, "check", "", "health check: tcp, http:PATH, grpc[:SERVICE] or none")
	fl.DurationVar(&f.checkInterval, "check-interval", 0, "how often the prober checks (default: the prober's)")
	fl.DurationVar(&f.checkTimeout, "check-timeout", 0, "how long one check may take (default: the prober's)")
	fl.DurationVar(&f.ttl, "ttl", record.DefaultTTL, "lease TTL, 2s..1h: how long the instance outlives this process if it dies")
	fl.DurationVar(&f.drainGrace, "drain-grace", 2*time.Second, "the longest to stay DRAINING, waiting for subscribers to apply it, before deregistering")
	return cmd
}

// instance builds and validates the instance the flags describe, by the
// registry's own rules, before anything is sent. Every refusal is a usage
// error (exit 2): missing required flags, malformed --service, --id, --meta
// and --check, and any value the registry would refuse (weight, address,
// TTL, zone, sizes), which names the record's field as the regnode would.
func (f *registerFlags) instance(cmd *cobra.Command) (*registryv1.Instance, error) {
	for _, name := range []string{"service", "id", "address"} {
		if v, _ := cmd.Flags().GetString(name); v == "" {
			return nil, usagef("--%s is required", name)
		}
	}
	if err := record.ValidService(f.service); err != nil {
		return nil, usagef("invalid --service: %v", err)
	}
	if err := record.ValidID(f.id); err != nil {
		return nil, usagef("invalid --id: %v", err)
	}
	md, err := parseMeta(f.meta)
	if err != nil {
		return nil, err
	}
	var interval, timeout *time.Duration
	if cmd.Flags().Changed("check-interval") {
		interval = &f.checkInterval
	}
	if cmd.Flags().Changed("check-timeout") {
		timeout = &f.checkTimeout
	}
	check, err := parseCheck(f.check, interval, timeout)
	if err != nil {
		return nil, err
	}
	if cmd.Flags().Changed("weight") {
		if err := validWeight(f.weight); err != nil {
			return nil, err
		}
	}
	inst := &registryv1.Instance{
		Service:   f.service,
		Id:        f.id,
		Address:   f.address,
		Zone:      f.zone,
		Version:   f.version,
		Weight:    f.weight,
		Metadata:  md,
		Check:     check,
		Lifecycle: registryv1.Lifecycle_LIFECYCLE_SERVING,
	}
	if err := record.Validate(inst); err != nil {
		return nil, fieldUsage(err)
	}
	if err := validTTL(f.ttl); err != nil {
		return nil, err
	}
	if f.drainGrace < 0 {
		return nil, fieldUsage(&record.FieldError{Field: "drain_grace", Reason: fmt.Sprintf("%s is negative", f.drainGrace)})
	}
	return inst, nil
}

// registerEvent is one line `register -o json` prints.
type registerEvent struct {
	Event   string `json:"event"` // registered, lost, draining, deregistered
	Service string `json:"service"`
	ID      string `json:"id"`
	LeaseID string `json:"lease_id,omitempty"`
}

// eventPrinter prints register's progress, from the keeper's goroutine as
// well as the command's.
type eventPrinter struct {
	mu sync.Mutex
	o  *options
}

func (p *eventPrinter) print(ev registerEvent, text string) {
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.o.json() {
		_ = p.o.printJSONLine(ev)
		return
	}
	fmt.Fprintln(p.o.stdout, text)
}

// signals counts SIGINT and SIGTERM: first, second and third are closed on
// the first, second and third signal.
type signals struct {
	ch                   chan os.Signal
	first, second, third chan struct{}
}

func notifySignals() *signals {
	s := &signals{ch: make(chan os.Signal, 3), first: make(chan struct{}), second: make(chan struct{}), third: make(chan struct{})}
	signal.Notify(s.ch, os.Interrupt, syscall.SIGTERM)
	go func() {
		n := 0
		for range s.ch {
			n++
			switch n {
			case 1:
				close(s.first)
			case 2:
				close(s.second)
			case 3:
				close(s.third)
			}
		}
	}()
	return s
}

func (s *signals) stop() {
	signal.Stop(s.ch)
	close(s.ch)
}

// cancelOn returns a context cancelled when ch is closed.
func cancelOn(parent context.Context, ch <-chan struct{}) (context.Context, context.CancelFunc) {
	ctx, cancel := context.WithCancel(parent)
	go func() {
		select {
		case <-ch:
			cancel()
		case <-ctx.Done():
		}
	}()
	return ctx, cancel
}

// runRegister registers inst, keeps it registered until a signal (or ctx
// ends), then drains and deregisters it.
func runRegister(ctx context.Context, o *options, inst *registryv1.Instance, ttl, drainGrace time.Duration) error {
	sigs := notifySignals()
	defer sigs.stop()

	// The SDK's warnings (renewal failures, a lost lease) go to stderr
	// once registered; while the first registration is retried they
	// would only repeat what the final error says.
	// Instead, on a terminal, the first failed attempt prints one line
	// saying regctl is still trying (the SDK reports a failed attempt only
	// to its logger).
	var level slog.LevelVar
	level.Set(slog.LevelError + 1)
	p := &eventPrinter{o: o}
	name := inst.GetService() + "/" + inst.GetId()
	retrying := &retryNotice{notify: func(err error) {
		p.mu.Lock()
		defer p.mu.Unlock()
		fmt.Fprintf(o.stderr, "regctl: %s; still trying to register %s for up to %s (--timeout), Ctrl-C to stop\n", describe(err, o), name, o.timeout)
	}}
	// Only where someone watches: on a pipe or in a file a failed
	// registration stays the one error line it always was.
	retrying.active.Store(isTerminal(o.stderr))
	logger := slog.New(&retryHandler{Handler: slog.NewTextHandler(o.stderr, &slog.HandlerOptions{Level: &level}), n: retrying})
	c, err := o.connect(logger)
	if err != nil {
		return err
	}
	defer c.Close()

	ev := func(event string, leaseID int64) registerEvent {
		e := registerEvent{Event: event, Service: inst.GetService(), ID: inst.GetId()}
		if leaseID != 0 {
			e.LeaseID = render.HexID(uint64(leaseID))
		}
		return e
	}
	// Close reports the record gone through OnChange too: that is not a
	// lost registration.
	var closing atomic.Bool
	onChange := func(st client.RegistrationStatus) {
		switch {
		case closing.Load():
		case !st.Registered:
			p.print(ev("lost", st.LeaseID), fmt.Sprintf("%s lost its registration (lease %s); registering again", name, render.HexID(uint64(st.LeaseID))))
		case st.Registrations > 1:
			p.print(ev("registered", st.LeaseID), fmt.Sprintf("registered %s again (lease %s)", name, render.HexID(uint64(st.LeaseID))))
		}
	}

	untilSignal, cancel := cancelOn(ctx, sigs.first)
	defer cancel()
	startCtx, cancelStart := context.WithTimeout(untilSignal, o.timeout)
	reg, err := c.Register(startCtx, inst, client.RegisterOptions{TTL: ttl, DrainGrace: drainGrace, OnChange: onChange})
	cancelStart()
	retrying.active.Store(false)
	if err != nil {
		switch {
		case untilSignal.Err() != nil:
			return fmt.Errorf("interrupted before %s was registered (if it was, its lease expires within %s)", name, ttl)
		case errors.Is(err, context.DeadlineExceeded):
			return &gaveUpError{msg: fmt.Sprintf("could not register %s within %s (--timeout): %v", name, o.timeout, err), last: err}
		}
		return err
	}
	level.Set(slog.LevelWarn)
	st := reg.Status()
	p.print(ev("registered", st.LeaseID), fmt.Sprintf("registered %s (lease %s, ttl %s); press Ctrl-C to drain and deregister", name, render.HexID(uint64(st.LeaseID)), ttl))

	<-untilSignal.Done()
	closing.Store(true)

	p.print(ev("draining", reg.Status().LeaseID), fmt.Sprintf("draining %s until every subscriber applied it (at most %s), then deregistering", name, drainGrace))
	closeCtx, cancelClose := cancelOn(context.Background(), sigs.second)
	defer cancelClose()
	closeCtx, cancelTimeout := context.WithTimeout(closeCtx, drainGrace+o.timeout)
	defer cancelTimeout()
	done := make(chan error, 1)
	go func() { done <- reg.Close(closeCtx) }()
	select {
	case err = <-done:
	case <-sigs.third:
		return fmt.Errorf("interrupted: %s stays registered until its lease expires (within %s)", name, ttl)
	}
	if err != nil {
		return err
	}
	p.print(ev("deregistered", 0), fmt.Sprintf("deregistered %s", name))
	return nil
}

// retryNotice calls notify once, for the first failed attempt logged
// while active (the first registration's retries).
type retryNotice struct {
	active atomic.Bool
	once   sync.Once
	notify func(err error)
}

// retryHandler passes records on to Handler at its own level, and shows
// retryNotice the SDK's warnings whatever that level: a failed attempt is
// a warning carrying its error as "err".
type retryHandler struct {
	slog.Handler
	n *retryNotice
}

func (h *retryHandler) Enabled(ctx context.Context, l slog.Level) bool {
	return h.Handler.Enabled(ctx, l) || (l >= slog.LevelWarn && h.n.active.Load())
}

func (h *retryHandler) Handle(ctx context.Context, r slog.Record) error {
	if r.Level >= slog.LevelWarn && h.n.active.Load() {
		r.Attrs(func(a slog.Attr) bool {
			if err, ok := a.Value.Any().(error); ok && a.Key == "err" {
				h.n.once.Do(func() { h.n.notify(err) })
				return false
			}
			return true
		})
	}
	if !h.Handler.Enabled(ctx, r.Level) {
		return nil
	}
	return h.Handler.Handle(ctx, r)
}

func (h *retryHandler) WithAttrs(as []slog.Attr) slog.Handler {
	return &retryHandler{Handler: h.Handler.WithAttrs(as), n: h.n}
}

func (h *retryHandler) WithGroup(name string) slog.Handler {
	return &retryHandler{Handler: h.Handler.WithGroup(name), n: h.n}
}

// isTerminal reports whether w is a terminal (a character device: a tty,
// or /dev/null, where a progress line costs nothing).
func isTerminal(w io.Writer) bool {
	f, ok := w.(*os.File)
	if !ok {
		return false
	}
	fi, err := f.Stat()
	return err == nil && fi.Mode()&os.ModeCharDevice != 0
}
