// Package dashboard is regnode's web dashboard: one page of plain HTML, CSS
// and JavaScript, embedded in the binary (no CDN, no build step, works
// offline), that shows services with their instances counted by state,
// every instance's lifecycle, health, reason, since, weight, zone, version
// and revision, the prober leader, the etcd members, and the revision and
// compact revision.
//
// The page reads only the JSON API of package httpapi: it lists through
// the watch's first snapshot and then follows the watch as Server-Sent
// Events, so it is live from the regnode's fan-out and never polls etcd
// for instances. The status panel (leader, members, compact revision) is
// one Status call when the stream (re)connects, after a drain or undrain,
// and at most every 5 s while progress arrives, because the leader and the
// members are not in the instance fan-out.
//
// An "xDS clients" section lists every regnode's xDS streams (or, with
// "every regnode" unchecked, this regnode's) from GET /api/v1/xds/clients:
// regnode, node id, kind, protocol, services followed, the revisions
// acknowledged and those behind, NACKs; on load, on Refresh and every
// 10 s (xDS streams live in each regnode's memory, not in the watch).
//
// Drain and undrain are real <button>s posting to the API; in read-only
// mode they are shown disabled with the reason. With Config.Auth (regnode
// --auth) the page asks for a token and sends it as "Authorization:
// Bearer" with every call, the watch stream included (read with fetch,
// since EventSource sends no headers); the regnode judges it as it judges
// any gRPC caller, so a read token shows the registry and only an operate
// token drains. The token is kept in the tab's sessionStorage, never in a
// URL. Every control is usable with the keyboard and shows its focus.
package dashboard

import (
	"bytes"
	"embed"
	"fmt"
	"html/template"
	"io/fs"
	"net/http"
)

//go:embed assets
var assets embed.FS

// Config configures the dashboard.
type Config struct {
	// ReadOnly shows drain and undrain disabled, for an API that refuses
	// them (see httpapi.Config.ReadOnly).
	ReadOnly bool
	// Auth says the regnode checks tokens (--auth): the page shows a
	// token field and sends the token entered with every call.
	Auth bool
}

// DefaultConfig is a dashboard with drain and undrain enabled and no
// token field.
func DefaultConfig() Config { return Config{} }

// Validate reports a Config that cannot work (none, today).
func (c *Config) Validate() error { return nil }

// Handler serves the dashboard: the page at "/" and its assets under
// "/assets/". Anything else is a 404.
type Handler struct {
	index  []byte
	static http.Handler
}

// New renders the page for cfg.
func New(cfg Config) (*Handler, error) {
	if err := cfg.Validate(); err != nil {
		return nil, err
	}
	t, err := template.ParseFS(assets, "assets/index.html")
	if err != nil {
		return nil, fmt.Errorf("dashboard: parse index.html: %w", err)
	}
	var b bytes.Buffer
	if err := t.Execute(&b, cfg); err != nil {
		return nil, fmt.Errorf("dashboard: render index.html: %w", err)
	}
	sub, err := fs.Sub(assets, "assets")
	if err != nil {
		return nil, fmt.Errorf("dashboard: assets: %w", err)
	}
	return &Handler{index: b.Bytes(), static: http.StripPrefix("/assets/", http.FileServerFS(sub))}, nil
}

// csp keeps the page to its own origin: a stray external reference fails
// loudly in the browser instead of quietly needing the network.
const csp = "default-src 'none'; script-src 'self'; style-src 'self'; connect-src 'self'; img-src 'self' data:; base-uri 'none'; form-action 'none'; frame-ancestors 'none'"

// ServeHTTP serves the page and its assets (GET and HEAD only).
func (h *Handler) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	if r.Method != http.MethodGet && r.Method != http.MethodHead {
		w.Header().Set("Allow", "GET, HEAD")
		http.Error(w, "method not allowed", http.StatusMethodNotAllowed)
		return
	}
	w.Header().Set("Content-Security-Policy", csp)
	w.Header().Set("X-Content-Type-Options", "nosniff")
	switch {
	case r.URL.Path == "/" || r.URL.Path == "/index.html":
		w.Header().Set("Content-Type", "text/html; charset=utf-8")
		w.Header().Set("Cache-Control", "no-cache")
		_, _ = w.Write(h.index)
	case len(r.URL.Path) > len("/assets/") && r.URL.Path[:len("/assets/")] == "/assets/" && r.URL.Path != "/assets/index.html":
		w.Header().Set("Cache-Control", "no-cache")
		h.static.ServeHTTP(w, r)
	default:
		http.NotFound(w, r)
	}
}
