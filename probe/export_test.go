package probe

// cachedConns returns how many gRPC connections p holds.
func (p *Checker) cachedConns() int {
	p.mu.Lock()
	defer p.mu.Unlock()
	return len(p.mu.conns)
}
