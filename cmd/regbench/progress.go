package main

import (
	"fmt"
	"io"
	"os"
	"sync"
	"time"
)

// progress keeps one status line on stderr while a scenario runs: redrawn
// in place on a terminal, a plain line every few seconds otherwise (so a
// log of `make bench` stays readable).
type progress struct {
	w        io.Writer
	tty      bool
	scenario string
	start    time.Time

	mu   sync.Mutex
	msg  string
	stop chan struct{}
	done chan struct{}
}

func isTerminal(w io.Writer) bool {
	f, ok := w.(*os.File)
	if !ok {
		return false
	}
	st, err := f.Stat()
	return err == nil && st.Mode()&os.ModeCharDevice != 0
}

// startProgress starts the line's goroutine; close stops it.
func startProgress(w io.Writer, scenario string) *progress {
	p := &progress{w: w, tty: isTerminal(w), scenario: scenario, start: time.Now(),
		stop: make(chan struct{}), done: make(chan struct{})}
	every := 5 * time.Second
	if p.tty {
		every = 200 * time.Millisecond
	}
	go func() {
		defer close(p.done)
		t := time.NewTicker(every)
		defer t.Stop()
		for {
			select {
			case <-p.stop:
				if p.tty {
					fmt.Fprint(p.w, "\r\x1b[K")
				}
				return
			case <-t.C:
				p.draw()
			}
		}
	}()
	return p
}

func (p *progress) draw() {
	p.mu.Lock()
	msg := p.msg
	p.mu.Unlock()
	line := fmt.Sprintf("[%s %5.1fs] %s", p.scenario, time.Since(p.start).Seconds(), msg)
	if p.tty {
		fmt.Fprint(p.w, "\r\x1b[K"+line)
	} else {
		fmt.Fprintln(p.w, line)
	}
}

// set replaces the status.
func (p *progress) set(format string, args ...any) {
	if p == nil {
		return
	}
	p.mu.Lock()
	p.msg = fmt.Sprintf(format, args...)
	p.mu.Unlock()
}

func (p *progress) close() {
	close(p.stop)
	<-p.done
}
