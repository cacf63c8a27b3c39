package probe

import "time"

// cachedConns returns how many gRPC connections p holds.
func (p *Checker) cachedConns() int {
	p.mu.Lock()
	defer p.mu.Unlock()
	return len(p.mu.conns)
}

// setGRPCCache sets the bound and the idle time of p's gRPC connections;
// call it before p's first probe.
func (p *Checker) setGRPCCache(maxConns int, idle time.Duration) {
	p.grpcMax, p.grpcIdle = maxConns, idle
}

// setNoLinger makes p's TCP probes close with a FIN, as they did before
// SO_LINGER 0; call it before p's first probe.
func (p *Checker) setNoLinger() { p.noLinger = true }
