package main

import (
	"io"
	"log/slog"
	"sync"
)

// syncWriter serializes the writes of the caller, the monitor and the
// loggers, so their lines never interleave.
type syncWriter struct {
	mu sync.Mutex
	w  io.Writer
}

func (s *syncWriter) Write(p []byte) (int, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.w.Write(p)
}

// prefixWriter puts a column of who is speaking before each record; a
// slog text handler writes one record per Write.
type prefixWriter struct {
	prefix string
	w      io.Writer
}

func (p prefixWriter) Write(b []byte) (int, error) {
	if _, err := p.w.Write(append([]byte(p.prefix+" | "), b...)); err != nil {
		return 0, err
	}
	return len(b), nil
}

// newLineHandler logs records at level and above as text lines behind
// prefix, without the time (the call lines carry the story's clock).
func newLineHandler(w io.Writer, prefix string, level slog.Level) slog.Handler {
	return slog.NewTextHandler(prefixWriter{prefix: prefix, w: w}, &slog.HandlerOptions{Level: level,
		ReplaceAttr: func(groups []string, a slog.Attr) slog.Attr {
			if len(groups) == 0 && a.Key == slog.TimeKey {
				return slog.Attr{}
			}
			return a
		}})
}
