package balance

// zoneSplit is zone-aware routing after Envoy's rule: if the local
// zone's share of the healthy weight is at least its share of the
// callers, every call stays in the zone; otherwise only that ratio of
// calls does and the rest spill over to the other zones (by weight). The
// callers' share of a zone is taken as even over the zones the service
// has healthy instances in (the client does not know where the other
// callers are). Below minInstances healthy instances, or with no local
// instance or no other zone, there is no zone routing: too few instances
// make the local share too coarse to trust (Envoy's min_cluster_size).
func zoneSplit(cands []cand, zone string, minInstances int, wrr bool) (local, remote *set, pLocal float64) {
	if zone == "" || len(cands) < minInstances {
		return nil, nil, 0
	}
	var loc, rem []cand
	var wl, wt uint64
	zones := map[string]bool{}
	for _, c := range cands {
		zones[c.zone] = true
		wt += c.w
		if c.zone == zone {
			loc = append(loc, c)
			wl += c.w
		} else {
			rem = append(rem, c)
		}
	}
	if len(loc) == 0 || len(rem) == 0 {
		return nil, nil, 0
	}
	share := float64(wl) / float64(wt)
	callers := 1 / float64(len(zones))
	return newSet(loc, wrr), newSet(rem, wrr), min(1, share/callers)
}
