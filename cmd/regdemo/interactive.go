package main

import (
	"bufio"
	"context"
	"fmt"
	"io"
	"slices"
	"strings"
	"time"

	registryv1 "github.com/regcluster/registry/proto/registry/v1"
)

const interactiveHelp = `commands (one per line):
  toggle A|B|C    flip the instance's fail mode (the seed's curl .../toggle_fail)
  drain A|B|C     DRAINING in the registry: no new call reaches it
  undrain A|B|C   SERVING again
  kill C          kill -9 C's process (A and B live in this one)
  heal            every instance healthy, serving and running again (C restarted)
  status          the registry's view, the client's weights, and the calls so far by phase
  quiet | loud    stop or resume the line per call
  quit            stop everything and exit (also end of input, or Ctrl-C)`

// RunInteractive starts the stack and the client, then runs the commands
// read from in until quit, the end of in, or ctx.
func RunInteractive(ctx context.Context, s Settings, in io.Reader, out io.Writer) error {
	start := time.Now()
	st, err := StartStack(ctx, s, out)
	if err != nil {
		return err
	}
	defer st.Close()
	story := newStory(st, out, start)
	story.mon = StartMonitor(st, out, start)
	defer story.mon.Stop()
	story.header()
	fmt.Fprintln(out, interactiveHelp)
	story.ph.enter("start", "start")
	story.caller = StartCaller(st.cc, out, start, story.ph.current)
	defer story.caller.Stop()

	// The reader ends at the end of in; for a terminal that is the
	// process's exit, which follows our return.
	lines := make(chan string)
	go func() {
		defer close(lines)
		sc := bufio.NewScanner(in)
		for sc.Scan() {
			select {
			case lines <- sc.Text():
			case <-ctx.Done():
				return
			}
		}
	}()
	for {
		var line string
		select {
		case <-ctx.Done():
			return ctx.Err()
		case l, ok := <-lines:
			if !ok {
				return nil
			}
			line = l
		}
		f := strings.Fields(strings.ToLower(line))
		if len(f) == 0 {
			continue
		}
		if f[0] == "quit" || f[0] == "exit" {
			return nil
		}
		if err := story.command(ctx, f); err != nil {
			fmt.Fprintf(out, "          !! %v\n", err)
		}
	}
}

func (s *Story) command(ctx context.Context, f []string) error {
	arg := func() (string, error) {
		if len(f) != 2 {
			return "", fmt.Errorf("%s needs one of A, B, C", f[0])
		}
		id := strings.ToUpper(f[1])
		if !slices.Contains(ids, id) {
			return "", fmt.Errorf("no instance %q (A, B or C)", f[1])
		}
		return id, nil
	}
	switch f[0] {
	case "help", "?":
		fmt.Fprintln(s.out, interactiveHelp)
	case "quiet", "loud":
		s.caller.SetQuiet(f[0] == "quiet")
	case "status":
		s.status()
	case "toggle":
		id, err := arg()
		if err != nil {
			return err
		}
		s.ph.enter("cmd", "after: toggle "+id)
		failing, err := s.st.Toggle(ctx, id)
		if err != nil {
			return err
		}
		s.say("%s fail mode: %v", id, failing)
	case "drain", "undrain":
		id, err := arg()
		if err != nil {
			return err
		}
		s.ph.enter("cmd", "after: "+f[0]+" "+id)
		if f[0] == "drain" {
			err = s.st.Drain(ctx, id)
		} else {
			err = s.st.Undrain(ctx, id)
		}
		if err != nil {
			return err
		}
		s.say("%s %sed", id, f[0])
	case "kill":
		id, err := arg()
		if err != nil {
			return err
		}
		if id != "C" {
			return fmt.Errorf("only C runs in a process of its own; try toggle %s or drain %s", id, id)
		}
		s.ph.enter("cmd", "after: kill C")
		if !s.st.KillC() {
			return fmt.Errorf("C is not running (heal starts it again)")
		}
		s.say("C killed (SIGKILL); its lease expires in %v", s.st.settings.TTL)
	case "heal":
		s.ph.enter("cmd", "after: heal")
		return s.heal(ctx)
	default:
		return fmt.Errorf("unknown command %q (help lists them)", f[0])
	}
	return nil
}

// heal makes every instance healthy, serving and running.
func (s *Story) heal(ctx context.Context) error {
	view := s.st.View()
	for _, id := range ids {
		if id == "C" && !s.st.CAlive() {
			if _, ok := view["C"]; ok {
				s.say("waiting for the killed C's record to go (its lease expires within %v) before starting C again", s.st.settings.TTL)
				if err := s.waitFor(ctx, "the killed C's record gone", func() bool { _, ok := s.st.View()["C"]; return !ok }); err != nil {
					return err
				}
			}
			if err := s.st.StartC(ctx); err != nil {
				return err
			}
			s.say("C running again on %s", s.st.Addr("C"))
			continue
		}
		down, err := isDown(ctx, s.st.http, s.st.Addr(id))
		if err != nil {
			return err
		}
		if down {
			if _, err := s.st.Toggle(ctx, id); err != nil {
				return err
			}
			s.say("%s healed", id)
		}
		if view[id].GetLifecycle() == registryv1.Lifecycle_LIFECYCLE_DRAINING {
			if err := s.st.Undrain(ctx, id); err != nil {
				return err
			}
			s.say("%s undrained", id)
		}
	}
	return nil
}

func (s *Story) status() {
	view := s.st.View()
	var b strings.Builder
	fmt.Fprintf(&b, "\n%-3s %-22s %-9s %-12s %-7s %s\n", "id", "address", "lifecycle", "health", "weight", "reason")
	for _, id := range ids {
		in, ok := view[id]
		if !ok {
			fmt.Fprintf(&b, "%-3s (not registered)\n", id)
			continue
		}
		fmt.Fprintf(&b, "%-3s %-22s %-9s %-12s %3d/%-3d %s\n", id, in.GetAddress(), state(in.GetLifecycle().String()),
			state(in.GetHealth().GetState().String()), s.st.Weight(id), in.GetWeight(), in.GetHealth().GetReason())
	}
	fmt.Fprint(s.out, b.String())
	s.summary(s.caller.Calls()).Render(s.out)
}
