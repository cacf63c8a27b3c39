package node

import (
	"context"
	"errors"
	"fmt"
	"net"
	"net/http"
	"time"

	"google.golang.org/grpc"
)

// Close stops the regnode and waits until nothing of it runs, in the order
// the package doc states (the reverse of Start's, what must go at once
// quiesced first). It is idempotent; it returns the errors of every part
// that failed to stop or had failed on its own, each naming the part.
func (n *Node) Close() error {
	err := n.life.Stop()
	if n.up { // it served: say it stopped
		n.log.Info("regnode stopped", "node", n.cfg.Name)
	}
	return err
}

// serveAPI serves the gRPC API on its listeners until ctx ends, then stops
// it (stopAPI). A listener that fails on its own stops the server on the
// others too: the regnode exits on Err.
func (n *Node) serveAPI(ctx context.Context) error {
	lis := []net.Listener{n.lis}
	if n.self != nil {
		lis = append(lis, n.self)
	}
	errc := make(chan error, len(lis))
	for i, l := range lis {
		go func() {
			err := n.grpc.Serve(l)
			if errors.Is(err, grpc.ErrServerStopped) {
				err = nil // stopped before it served: nothing failed
			}
			if err != nil && i > 0 {
				err = fmt.Errorf("in-memory listener: %w", err)
			}
			errc <- err
		}()
	}
	var err error
	select {
	case err = <-errc:
		n.grpc.Stop()
	case <-ctx.Done():
		n.stopAPI()
		err = <-errc
	}
	for range len(lis) - 1 {
		err = errors.Join(err, <-errc)
	}
	return err
}

// stopAPI stops the gRPC API gracefully: calls in flight get ShutdownGrace
// to finish, then streams still open (KeepAlive; Watch streams ended
// already with the hub) are closed and clients move to another regnode.
func (n *Node) stopAPI() {
	stopped := make(chan struct{})
	go func() { n.grpc.GracefulStop(); close(stopped) }()
	t := time.NewTimer(n.cfg.ShutdownGrace)
	defer t.Stop()
	select {
	case <-stopped:
	case <-t.C:
		n.grpc.Stop() // long streams (KeepAlive, Watch) end here
		<-stopped
	}
}

// serveHTTP serves metrics, the HTTP API and the dashboard until ctx ends,
// then shuts the server down, giving requests in flight ShutdownGrace.
func (n *Node) serveHTTP(ctx context.Context) error {
	serve := n.mhttp.Serve
	if n.mhttp.TLSConfig != nil {
		// The certificate comes from TLSConfig (reloaded), not files.
		serve = func(l net.Listener) error { return n.mhttp.ServeTLS(l, "", "") }
	}
	errc := make(chan error, 1)
	go func() { errc <- serve(n.mlis) }()
	select {
	case err := <-errc: // failed on its own: only Shutdown below closes it
		return err
	case <-ctx.Done():
	}
	sctx, cancel := context.WithTimeout(context.Background(), n.cfg.ShutdownGrace)
	defer cancel()
	err := n.mhttp.Shutdown(sctx)
	if serr := <-errc; !errors.Is(serr, http.ErrServerClosed) {
		err = errors.Join(err, serr)
	}
	return err
}
