package node

// Components names the parts of n its stopper holds, in start order (Close
// stops them in the reverse order): for tests of the wiring.
func (n *Node) Components() []string { return n.life.Started() }
