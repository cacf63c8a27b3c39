package render

import (
	registryv1 "github.com/regcluster/registry/proto/registry/v1"
)

// Status is the JSON form of a regnode's StatusResponse, as `regctl status
// -o json` prints it.
type Status struct {
	// Node is the regnode that answered.
	Node string `json:"node"`
	// Leader is the regnode leading the prober, empty when none is.
	Leader          string   `json:"leader"`
	Revision        int64    `json:"revision"`
	CompactRevision int64    `json:"compact_revision"`
	Members         []Member `json:"members"`
	// ClusterID is the etcd cluster id, in hex.
	ClusterID string `json:"cluster_id"`
	// Epoch names the etcd history the regnode follows: it changes when
	// etcd is restored from a backup, while the cluster id may not.
	Epoch       string `json:"epoch"`
	Counts      Counts `json:"counts"`
	JunkSkipped int64  `json:"junk_skipped"`
	// Embedded says whether the regnode embeds an etcd member.
	Embedded    bool   `json:"embedded"`
	EtcdVersion string `json:"etcd_version"`
	// Version is the regnode's own version.
	Version string `json:"version"`
	// Probing is each announced regnode's share of the probing (when
	// asked for every regnode), else the answering regnode's alone.
	Probing []Probing `json:"probing"`
}

// Probing is one regnode's prober in Status: its share of the checked
// instances, its probe rate, and how it judges.
type Probing struct {
	Node            string  `json:"node"`
	Address         string  `json:"address"`
	Zone            string  `json:"zone"`
	Owned           int64   `json:"owned"`
	Probes          uint64  `json:"probes"`
	ProbesPerSecond float64 `json:"probes_per_second"`
	Disagreements   uint64  `json:"disagreements"`
	Held            uint64  `json:"held"`
	// Canary says why its canaries fail, empty while they pass.
	Canary  string `json:"canary"`
	Members int32  `json:"members"`
	// Error is set when that regnode could not be asked.
	Error string `json:"error,omitempty"`
}

func newProbing(p *registryv1.Probing) Probing {
	return Probing{Node: p.GetNode(), Address: p.GetAddress(), Zone: p.GetZone(), Owned: p.GetOwned(), Probes: p.GetProbes(),
		ProbesPerSecond: p.GetProbesPerSecond(), Disagreements: p.GetDisagreements(), Held: p.GetHeld(), Canary: p.GetCanary(),
		Members: p.GetMembers(), Error: p.GetError()}
}

// Member is one etcd member in Status.
type Member struct {
	// ID is the member id, in hex.
	ID         string   `json:"id"`
	Name       string   `json:"name"`
	PeerURLs   []string `json:"peer_urls"`
	ClientURLs []string `json:"client_urls"`
	IsLeader   bool     `json:"is_leader"`
	IsLearner  bool     `json:"is_learner"`
}

// Counts is the registry-wide instance counts in Status.
type Counts struct {
	Total       int64 `json:"total"`
	Starting    int64 `json:"starting"`
	Serving     int64 `json:"serving"`
	Draining    int64 `json:"draining"`
	Healthy     int64 `json:"healthy"`
	Degraded    int64 `json:"degraded"`
	Unavailable int64 `json:"unavailable"`
	Unknown     int64 `json:"unknown"`
	Services    int64 `json:"services"`
}

// NewStatus converts a StatusResponse to its JSON form.
func NewStatus(s *registryv1.StatusResponse) Status {
	members := make([]Member, 0, len(s.GetMembers()))
	for _, m := range s.GetMembers() {
		members = append(members, Member{
			ID:         HexID(m.GetId()),
			Name:       m.GetName(),
			PeerURLs:   nonNil(m.GetPeerUrls()),
			ClientURLs: nonNil(m.GetClientUrls()),
			IsLeader:   m.GetIsLeader(),
			IsLearner:  m.GetIsLearner(),
		})
	}
	probing := []Probing{}
	for _, p := range s.GetRegnodes() {
		probing = append(probing, newProbing(p))
	}
	if len(probing) == 0 && s.GetProbing() != nil {
		probing = append(probing, newProbing(s.GetProbing()))
	}
	c := s.GetCounts()
	return Status{
		Probing:         probing,
		Node:            s.GetNode(),
		Leader:          s.GetLeader(),
		Revision:        s.GetRevision(),
		CompactRevision: s.GetCompactRevision(),
		Members:         members,
		ClusterID:       HexID(s.GetClusterId()),
		Epoch:           s.GetEpoch(),
		Counts: Counts{
			Total:       c.GetTotal(),
			Starting:    c.GetStarting(),
			Serving:     c.GetServing(),
			Draining:    c.GetDraining(),
			Healthy:     c.GetHealthy(),
			Degraded:    c.GetDegraded(),
			Unavailable: c.GetUnavailable(),
			Unknown:     c.GetUnknown(),
			Services:    c.GetServices(),
		},
		JunkSkipped: s.GetJunkSkipped(),
		Embedded:    s.GetEmbedded(),
		EtcdVersion: s.GetEtcdVersion(),
		Version:     s.GetVersion(),
	}
}

func nonNil(s []string) []string {
	if s == nil {
		return []string{}
	}
	return s
}
