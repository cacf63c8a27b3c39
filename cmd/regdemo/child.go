package main

import (
	"bufio"
	"context"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"os"
	"os/exec"
	"strconv"
	"strings"
	"time"

	"github.com/regcluster/registry/client"
	registryv1 "github.com/regcluster/registry/proto/registry/v1"
	"github.com/regcluster/registry/record"
	"google.golang.org/protobuf/types/known/durationpb"
)

// demoService is the service the backends register and the client calls.
const demoService = "demo"

// childArg, as the first argument, makes regdemo (or its test binary) the
// process of one backend, so that it can be kill -9'd:
//
//	__regdemo-backend ID WEIGHT REGNODE TTL
//
// It serves and registers itself through the SDK, prints "ready ADDR",
// and runs until stdin closes (then drains, deregisters and exits 0).
const childArg = "__regdemo-backend"

// demoCheck is the HTTP check every backend registers with: a probe a
// second, and thresholds lower than the prober's defaults (3 and 5
// failures, 5 and 3 successes) so the story stays short; still slower
// than the client's five failed calls in a row, so the client ejects a
// failing instance before the registry marks it.
func demoCheck() *registryv1.HealthCheck {
	return &registryv1.HealthCheck{
		Kind: registryv1.CheckKind_CHECK_KIND_HTTP, Target: "/health",
		Interval: durationpb.New(time.Second), Timeout: durationpb.New(500 * time.Millisecond),
		FailuresToDegraded: 2, FailuresToUnavailable: 2, SuccessesToDegraded: 1, SuccessesToHealthy: 1,
	}
}

// registerBackend registers b with weight through c and keeps it
// registered. An id still alive under a previous owner (C restarted
// before its killed predecessor's lease expired) is waited for, up to ctx.
func registerBackend(ctx context.Context, c *client.Client, b *Backend, weight uint32, ttl time.Duration) (*client.Registration, error) {
	inst := &registryv1.Instance{Service: demoService, Id: b.ID, Address: b.Addr, Weight: weight,
		Version: "demo", Check: demoCheck()}
	for {
		reg, err := c.Register(ctx, inst, client.RegisterOptions{TTL: ttl, DrainGrace: 100 * time.Millisecond})
		if !errors.Is(err, record.ErrAlreadyExists) {
			return reg, err
		}
		t := time.NewTimer(250 * time.Millisecond)
		select {
		case <-t.C:
		case <-ctx.Done():
			t.Stop()
			return nil, fmt.Errorf("register %s: its previous registration is still alive: %w", b.ID, err)
		}
	}
}

// childMain runs one backend process; its exit code.
func childMain(args []string, stdin io.Reader, stdout io.Writer) int {
	if err := child(args, stdin, stdout); err != nil {
		fmt.Fprintf(os.Stderr, "regdemo backend: %v\n", err)
		return 1
	}
	return 0
}

func child(args []string, stdin io.Reader, stdout io.Writer) error {
	if len(args) != 4 {
		return fmt.Errorf("want ID WEIGHT REGNODE TTL, got %q", args)
	}
	id, regnode := args[0], args[2]
	weight, err := strconv.ParseUint(args[1], 10, 32)
	if err != nil {
		return fmt.Errorf("WEIGHT %q: %w", args[1], err)
	}
	ttl, err := time.ParseDuration(args[3])
	if err != nil {
		return fmt.Errorf("TTL %q: %w", args[3], err)
	}
	b, err := StartBackend(id)
	if err != nil {
		return err
	}
	defer b.Close()
	c, err := client.New(client.Config{Endpoints: []string{regnode},
		Logger: slog.New(newLineHandler(os.Stderr, id+" proc ", slog.LevelWarn))})
	if err != nil {
		return err
	}
	defer c.Close()
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	reg, err := registerBackend(ctx, c, b, uint32(weight), ttl)
	cancel()
	if err != nil {
		return err
	}
	fmt.Fprintf(stdout, "ready %s\n", b.Addr)
	// The parent holds our stdin: EOF means it is done with us, or dead.
	_, _ = io.Copy(io.Discard, stdin)
	ctx, cancel = context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	return reg.Close(ctx)
}

// childBackend is the parent's handle on a backend process.
type childBackend struct {
	ID   string
	Addr string
	cmd  *exec.Cmd
	in   io.WriteCloser
	done chan struct{} // closed once the process is reaped
	err  error         // its Wait error, set before done closes
}

// startChild starts backend id in a process of its own and returns once
// it is registered.
func startChild(ctx context.Context, id string, weight uint32, regnode string, ttl time.Duration, stderr io.Writer) (*childBackend, error) {
	exe, err := os.Executable()
	if err != nil {
		return nil, fmt.Errorf("start backend %s: %w", id, err)
	}
	cmd := exec.Command(exe, childArg, id, strconv.FormatUint(uint64(weight), 10), regnode, ttl.String())
	cmd.Stderr = stderr
	cmd.SysProcAttr = childSysProcAttr()
	in, err := cmd.StdinPipe()
	if err != nil {
		return nil, err
	}
	out, err := cmd.StdoutPipe()
	if err != nil {
		return nil, err
	}
	if err := cmd.Start(); err != nil {
		return nil, fmt.Errorf("start backend %s: %w", id, err)
	}
	p := &childBackend{ID: id, cmd: cmd, in: in, done: make(chan struct{})}
	ready := make(chan string, 1)
	go func() { // owns the process: reads its one line, then reaps it
		defer close(p.done)
		sc := bufio.NewScanner(out)
		if sc.Scan() {
			ready <- sc.Text()
		}
		close(ready)
		_, _ = io.Copy(io.Discard, out)
		p.err = cmd.Wait()
	}()
	t := time.NewTimer(40 * time.Second)
	defer t.Stop()
	select {
	case line, ok := <-ready:
		addr, found := strings.CutPrefix(line, "ready ")
		if ok && found {
			p.Addr = addr
			return p, nil
		}
		p.Kill()
		return nil, fmt.Errorf("backend %s did not start: %v", id, p.err)
	case <-t.C:
		p.Kill()
		return nil, fmt.Errorf("backend %s not ready within 40s", id)
	case <-ctx.Done():
		p.Kill()
		return nil, ctx.Err()
	}
}

// Kill is kill -9: no drain, no deregistration; the lease expires. It
// returns once the process is reaped.
func (p *childBackend) Kill() {
	_ = p.cmd.Process.Kill()
	<-p.done
}

// Exited reports whether the process has ended.
func (p *childBackend) Exited() bool {
	select {
	case <-p.done:
		return true
	default:
		return false
	}
}

// Stop asks the process to drain and deregister (closing its stdin), and
// kills it if it has not exited within 10s. It returns once it is reaped.
func (p *childBackend) Stop() {
	_ = p.in.Close()
	t := time.NewTimer(10 * time.Second)
	defer t.Stop()
	select {
	case <-p.done:
	case <-t.C:
		p.Kill()
	}
}
