package xds

// Clients lists the xDS streams this Server serves, by protocol and
// stream id (delta first): who
// each client is, what it follows, the revision of each service's
// endpoints it acknowledged and the one served now, and its NACKs.
func (s *Server) Clients() []ClientInfo {
	cs := s.acks.clients() // before s.mu: a build holds s.mu, then the tracker's
	s.mu.Lock()
	defer s.mu.Unlock()
	for i := range cs {
		for j := range cs[i].Services {
			if b := s.built[cs[i].Services[j].Service]; b != nil {
				cs[i].Services[j].Revision = b.rev
			}
		}
	}
	return cs
}
