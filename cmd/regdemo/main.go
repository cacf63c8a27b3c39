// Command regdemo replays seed 001's experiment live on this repository's
// stack: a registry, instances that can be made to fail with
// /toggle_fail, and a client that fails over and recovers.
//
//	regdemo                 the scripted story, then a summary; exit 0 if it went as scripted
//	regdemo -interactive    keep running; commands on stdin (help lists them)
//
// It starts a regnode on embedded etcd (in this process, data in a temp
// dir, loopback ports picked free), three backends A, B and C (real gRPC
// servers that also serve the seed's /health, /work and /toggle_fail over
// HTTP on the same port, registered through the SDK with an HTTP check on
// /health), C in a child process of its own so that it can be kill -9'd,
// and a client that calls registry:///demo through the SDK's data plane
// (client.DialOptions) ten times a second, printing which instance
// answered each call.
//
// The story: all healthy (calls split by weight); A toggled to failing
// (the client ejects it after five failed attempts in a row, retried
// elsewhere; the prober marks it UNAVAILABLE); A healed (half-open, then
// the slow-start ramp); B drained (no new call reaches it); C killed with
// SIGKILL (its call in flight is retried, nothing fails); then a table of
// calls, failures and shares per phase, and how long each switch took.
// Each phase waits for a condition ("A out of rotation"), never longer
// than a minute: a loaded machine makes the story slower, not wrong.
//
// It needs no network beyond loopback and leaves nothing behind: the
// child is reaped and the temp dir removed on success, on failure and on
// Ctrl-C (exit 130).
package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"io"
	"os"
	"os/signal"
	"syscall"
	"time"
)

func main() {
	if len(os.Args) > 1 && os.Args[1] == childArg {
		os.Exit(childMain(os.Args[2:], os.Stdin, os.Stdout))
	}
	os.Exit(mainWith(os.Args[1:], os.Stdin, os.Stdout, os.Stderr))
}

// mainWith is the command: its exit code.
func mainWith(args []string, stdin io.Reader, stdout, stderr io.Writer) int {
	fs := flag.NewFlagSet("regdemo", flag.ContinueOnError)
	fs.SetOutput(stderr)
	interactive := fs.Bool("interactive", false, "keep running and take commands on stdin (toggle A, drain B, kill C, heal, status, quit)")
	d := DefaultSettings()
	slow := fs.Duration("slow-start", d.SlowStart, "the client's slow-start window (the SDK's default is 30s)")
	ejection := fs.Duration("base-ejection", d.BaseEjection, "the client's first ejection (the SDK's default is 30s)")
	ttl := fs.Duration("ttl", d.TTL, "the backends' lease TTL (the SDK's default is 10s)")
	fs.Usage = func() {
		fmt.Fprintln(stderr, "usage: regdemo [-interactive] [-slow-start D] [-base-ejection D] [-ttl D]")
		fs.PrintDefaults()
	}
	if err := fs.Parse(args); err != nil {
		if errors.Is(err, flag.ErrHelp) {
			return 0
		}
		return 2
	}
	if fs.NArg() > 0 {
		fmt.Fprintf(stderr, "regdemo: unexpected argument %q\n", fs.Arg(0))
		fs.Usage()
		return 2
	}
	s := Settings{SlowStart: *slow, BaseEjection: *ejection, TTL: *ttl}
	if err := s.Validate(); err != nil {
		fmt.Fprintf(stderr, "regdemo: %v\n", err)
		return 2
	}
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	defer stop()
	out := &syncWriter{w: stdout}
	var err error
	if *interactive {
		err = RunInteractive(ctx, s, stdin, out)
	} else {
		_, err = RunStory(ctx, s, out)
	}
	switch {
	case err == nil:
		return 0
	case ctx.Err() != nil:
		fmt.Fprintln(stderr, "regdemo: interrupted; everything it started is stopped")
		return 130
	}
	fmt.Fprintf(stderr, "regdemo: %v\n", err)
	return 1
}

// Validate reports a setting the client or the registry would refuse.
func (s Settings) Validate() error {
	switch {
	case s.SlowStart < 0 || s.SlowStart > time.Hour:
		return fmt.Errorf("-slow-start %v is not in 0..1h", s.SlowStart)
	case s.BaseEjection <= 0 || s.BaseEjection > 6*time.Minute:
		return fmt.Errorf("-base-ejection %v is not in (0, 6m]", s.BaseEjection)
	case s.TTL < 2*time.Second || s.TTL > time.Hour:
		return fmt.Errorf("-ttl %v is not in 2s..1h", s.TTL)
	}
	return s.policy().Validate()
}

// RunStory starts the stack, plays the scripted story, prints the summary
// and stops everything.
func RunStory(ctx context.Context, s Settings, out io.Writer) (*Summary, error) {
	start := time.Now()
	st, err := StartStack(ctx, s, out)
	if err != nil {
		return nil, err
	}
	defer st.Close()
	story := newStory(st, out, start)
	sum, err := story.Run(ctx)
	if err != nil {
		return nil, err
	}
	sum.Render(out)
	return sum, nil
}
