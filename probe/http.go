package probe

import (
	"context"
	"io"
	"net"
	"net/http"
	"strconv"
	"strings"
	"time"

	"github.com/regcluster/registry/health"
)

// The bounds of HTTP probes.
const (
	// MaxBody is how much of a health endpoint's body a probe reads (and
	// discards); the rest is never read, and the connection is then
	// closed rather than kept.
	MaxBody = 4 << 10

	// Keep-alive connections kept between probes, in all: past it, the
	// connection of a probe is closed when the probe ends, so a registry
	// of any size (or one that lists many addresses to fill the pool)
	// makes the Checker hold at most this many idle connections.
	maxIdleConns        = 1024
	maxIdleConnsPerHost = 1 // one probe at a time per instance
	// idleConnTimeout closes a kept connection (HTTP and gRPC) unused
	// this long: far above the usual probe interval (1s), so an instance
	// probed at any interval under it keeps its connection.
	idleConnTimeout = 90 * time.Second
	maxHeaderBytes  = 64 << 10
)

// newTransport returns the Checker's HTTP transport: plain HTTP/1.1 with a
// bounded keep-alive pool, and no proxy (the environment's proxy settings
// are for callers, not for reaching instances directly). Probes of one
// instance reuse one connection as long as the instance keeps it open
// and its answers are read whole (a body of at most MaxBody); a TCP probe
// instead opens and resets a connection each time.
func newTransport() *http.Transport {
	return &http.Transport{
		Proxy:                  nil,
		DialContext:            (&net.Dialer{KeepAlive: 30 * time.Second}).DialContext,
		MaxIdleConns:           maxIdleConns,
		MaxIdleConnsPerHost:    maxIdleConnsPerHost,
		IdleConnTimeout:        idleConnTimeout,
		MaxResponseHeaderBytes: maxHeaderBytes,
		DisableCompression:     true,
	}
}

// noRedirect makes the client return a 3xx response as it is: a health
// endpoint that redirects (maybe to another host) has not answered.
func noRedirect(*http.Request, []*http.Request) error { return http.ErrUseLastResponse }

// probeHTTP sends GET http://address+target. A 2xx status is OK; any other
// is Unhealthy. The probe is complete when the status and up to MaxBody
// bytes of the body have arrived: an error while reading them counts like
// any other.
func (p *Checker) probeHTTP(ctx context.Context, address, target string, timeout time.Duration) (health.Outcome, string) {
	if !strings.HasPrefix(target, "/") {
		target = "/" + target
	}
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, "http://"+address+target, nil)
	if err != nil {
		return health.Error, "bad health URL: " + err.Error()
	}
	req.Header.Set("User-Agent", p.userAgent)
	resp, err := p.http.Do(req)
	if err != nil {
		return failure(ctx, err, timeout)
	}
	// Reading the body to its end (within MaxBody) is what lets the
	// transport keep the connection for the next probe.
	_, err = io.Copy(io.Discard, io.LimitReader(resp.Body, MaxBody))
	_ = resp.Body.Close()
	if err != nil {
		return failure(ctx, err, timeout)
	}
	return httpStatus(resp.StatusCode)
}

// httpStatus maps a status code to an outcome: 2xx OK, else Unhealthy,
// saying which contract failed.
func httpStatus(code int) (health.Outcome, string) {
	s := "HTTP " + strconv.Itoa(code)
	switch {
	case code >= 200 && code < 300:
		return health.OK, ""
	case code >= 300 && code < 400:
		return health.Unhealthy, s + ": redirects are not followed"
	case code >= 400 && code < 500:
		return health.Unhealthy, s + ": the health endpoint's contract failed"
	}
	return health.Unhealthy, s
}
