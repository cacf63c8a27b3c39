package httpapi

import (
	"bytes"
	"encoding/json"
	"fmt"
	"net/http"
	"strconv"

	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	"github.com/regcluster/registry/internal/chunk"
	"github.com/regcluster/registry/internal/render"
	registryv1 "github.com/regcluster/registry/proto/registry/v1"
	"github.com/regcluster/registry/record"
)

// watch serves GET /api/v1/watch as Server-Sent Events, one gRPC Watch
// stream per request, so it is served from the regnode's fan-out (the
// cache and ring behind every Watch), never from an etcd watch or poll of
// its own.
//
// Every SSE event's data is one line of `regctl watch -o json` (a
// snapshot, put, delete or progress). The last event of each gRPC message
// (one etcd transaction, one joined snapshot, one progress) carries
// "id: REVISION": a browser's EventSource sends it back as Last-Event-ID
// when it reconnects, and the watch resumes after it (the missed
// transactions, or a reset snapshot), exactly like a regctl watch that
// resumes. Only the last event has an id so that a reconnect never
// resumes in the middle of a transaction.
//
// Errors found before the first message (a bad service or from_revision,
// a regnode that cannot serve) are plain JSON errors with their HTTP
// status; once the stream has started, it just ends.
func (a *API) watch(w http.ResponseWriter, r *http.Request) {
	if e := query(r, "service", "from_revision"); e != nil {
		writeError(w, http.StatusBadRequest, e)
		return
	}
	q := r.URL.Query()
	service := q.Get("service")
	if service != "" {
		if err := record.ValidService(service); err != nil {
			writeError(w, http.StatusBadRequest, fieldError(err, "service"))
			return
		}
	}
	var from int64
	for _, src := range []struct{ field, value string }{
		{"from_revision", q.Get("from_revision")},
		{"Last-Event-ID", r.Header.Get("Last-Event-ID")}, // a reconnect: newer than the URL's
	} {
		if src.value == "" {
			continue
		}
		v, err := strconv.ParseInt(src.value, 10, 64)
		if err != nil || v < 0 {
			writeError(w, http.StatusBadRequest, badField(src.field, "%q is not a revision (an integer >= 0)", src.value))
			return
		}
		from = v
	}
	rc := http.NewResponseController(w)

	stream, err := a.rpc.Watch(a.callerContext(r), &registryv1.WatchRequest{Service: service, FromRevision: from})
	if err != nil {
		a.writeRPCError(w, r, err)
		return
	}
	var units chunk.Joiner
	first, err := recvJoined(stream, &units)
	if err != nil {
		a.writeRPCError(w, r, err)
		return
	}
	h := w.Header()
	h.Set("Content-Type", "text/event-stream")
	h.Set("Cache-Control", "no-store")
	h.Set("X-Accel-Buffering", "no") // a proxy in front must not buffer the stream
	w.WriteHeader(http.StatusOK)
	// A browser reconnects a second after the stream ends (a regnode
	// stopping, a network blip), from the last id it saw.
	var buf bytes.Buffer
	buf.WriteString("retry: 1000\n\n")
	for m := first; ; {
		writeEvents(&buf, m)
		if _, err := w.Write(buf.Bytes()); err != nil {
			return
		}
		buf.Reset()
		if err := rc.Flush(); err != nil {
			return
		}
		if m, err = recvJoined(stream, &units); err != nil {
			if s := status.Code(err); s != codes.Canceled && r.Context().Err() == nil {
				a.cfg.Logger.Debug("http watch ended", "service", service, "err", err)
			}
			return
		}
	}
}

// watchStream is what recvJoined reads: the client side of a gRPC Watch.
type watchStream interface {
	Recv() (*registryv1.WatchResponse, error)
}

// recvJoined reads the next unit of the stream: a snapshot, or one etcd
// transaction's events, sent in chunks of at most chunk.MaxBytes, joined
// back whole (package chunk), so an SSE client, like regctl watch, never
// sees half a snapshot or half a transaction.
func recvJoined(s watchStream, j *chunk.Joiner) (*registryv1.WatchResponse, error) {
	for {
		m, err := s.Recv()
		if err != nil {
			return nil, err
		}
		unit, err := j.Add(m)
		if err != nil {
			return nil, fmt.Errorf("watch: %w", err)
		}
		if unit != nil {
			return unit, nil
		}
	}
}

// writeEvents appends m's SSE events to buf: one per watch line, the last
// with the revision as its id.
func writeEvents(buf *bytes.Buffer, m *registryv1.WatchResponse) {
	lines := render.NewWatchLines(m)
	if len(lines) == 0 {
		// An event batch whose events were all of an unknown kind: keep
		// the revision moving for the client.
		lines = []render.WatchLine{render.NewProgressLine(m.GetRevision())}
	}
	enc := json.NewEncoder(buf)
	enc.SetEscapeHTML(false) // as regctl prints it
	for i, l := range lines {
		buf.WriteString("data: ")
		// Encode ends the JSON with the newline that ends the data line;
		// JSON has no raw newline inside, so one line is one event. It
		// cannot fail on these plain structs of strings and numbers.
		_ = enc.Encode(l)
		if i == len(lines)-1 {
			buf.WriteString("id: ")
			buf.WriteString(strconv.FormatInt(m.GetRevision(), 10))
			buf.WriteByte('\n')
		}
		buf.WriteByte('\n')
	}
}
