package node

import (
	"context"
	"errors"
	"fmt"
	"time"
)

// Close stops the regnode: health turns NOT_SERVING, calls in flight get
// ShutdownGrace to finish, streams are closed (clients move to another
// regnode), then the etcd client and the embedded member close. It is
// idempotent.
func (n *Node) Close() error {
	n.closeOnce.Do(func() { n.closeErr = n.shutdown() })
	return n.closeErr
}

func (n *Node) shutdown() error {
	close(n.done)
	if n.health != nil {
		n.health.Shutdown()
	}
	if n.stopEl != nil {
		n.stopEl() // resigns: another regnode takes over probing at once
		t := time.NewTimer(n.cfg.ShutdownGrace)
		select {
		case <-n.elDone:
		case <-t.C:
			// Opening an election session waits on etcd for as long as
			// the client lives: with etcd unreachable only closing the
			// client ends it (a second Close below is harmless).
			n.log.Warn("election still waiting on etcd; closing the etcd client to stop it")
			n.cli.Close()
			<-n.elDone
		}
		t.Stop()
	}
	if n.probe != nil {
		n.probe.Close()
	}
	if n.stopHub != nil {
		n.stopHub() // ends every Watch stream: subscribers resume elsewhere
	}
	if n.grpc != nil {
		stopped := make(chan struct{})
		go func() { n.grpc.GracefulStop(); close(stopped) }()
		t := time.NewTimer(n.cfg.ShutdownGrace)
		select {
		case <-stopped:
		case <-t.C:
			n.grpc.Stop() // long streams (KeepAlive, Watch) end here
			<-stopped
		}
		t.Stop()
	}
	var errs []error
	if n.mhttp != nil {
		ctx, cancel := context.WithTimeout(context.Background(), n.cfg.ShutdownGrace)
		if err := n.mhttp.Shutdown(ctx); err != nil {
			errs = append(errs, fmt.Errorf("stop metrics server: %w", err))
		}
		cancel()
	} else if n.mlis != nil {
		n.mlis.Close()
	}
	if n.grpc == nil && n.lis != nil {
		n.lis.Close()
	}
	if n.stopAuth != nil {
		n.stopAuth()
	}
	n.wg.Wait()
	// No call is in flight now: the pool's idle leases are nobody's, so
	// they are revoked while etcd is still there (a crash leaves them to
	// expire within their TTL).
	if n.commit != nil {
		n.commit.Close()
	}
	if n.leases != nil {
		ctx, cancel := context.WithTimeout(context.Background(), n.cfg.ShutdownGrace)
		if err := n.leases.Close(ctx); err != nil {
			n.log.Warn("revoke the lease pool's idle leases (they expire within their TTL)", "err", err)
		}
		cancel()
	}
	if n.renew != nil {
		n.renew.Close()
	}
	if n.cli != nil {
		if err := n.cli.Close(); err != nil && !errors.Is(err, context.Canceled) {
			errs = append(errs, fmt.Errorf("close etcd client: %w", err))
		}
	}
	if n.etcd != nil {
		n.etcd.Close() // flushes and closes the member's WAL and backend
	}
	if err := n.dataDir.Unlock(); err != nil {
		errs = append(errs, err)
	}
	if n.grpc != nil { // it served: say it stopped
		n.log.Info("regnode stopped", "node", n.cfg.Name)
	}
	return errors.Join(errs...)
}
