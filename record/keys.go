package record

import (
	"strings"
)

// DefaultPrefix is the key prefix every regnode and SDK uses unless told.
const DefaultPrefix = "/registry/v1/"

// Keys is the key layout under one prefix:
//
//	<prefix>instances/<service>/<instance-id>
//	<prefix>election/prober
type Keys struct {
	prefix string
}

// NewKeys returns the layout under prefix, adding a trailing '/' if missing.
// An empty prefix means DefaultPrefix.
func NewKeys(prefix string) Keys {
	if prefix == "" {
		prefix = DefaultPrefix
	}
	if !strings.HasSuffix(prefix, "/") {
		prefix += "/"
	}
	return Keys{prefix: prefix}
}

// Prefix is the root of everything the registry writes.
func (k Keys) Prefix() string { return k.prefix }

// Instances is the prefix of every instance key.
func (k Keys) Instances() string { return k.prefix + "instances/" }

// Service is the prefix of the instance keys of one service.
func (k Keys) Service(service string) string { return k.Instances() + service + "/" }

// Instance is the key of one instance.
func (k Keys) Instance(service, id string) string { return k.Service(service) + id }

// Election is the prefix the prober's leader election campaigns on.
func (k Keys) Election() string { return k.prefix + "election/prober" }

// Parse splits an instance key into service and id. ok is false for any key
// that is not exactly <prefix>instances/<service>/<id>.
func (k Keys) Parse(key string) (service, id string, ok bool) {
	rest, found := strings.CutPrefix(key, k.Instances())
	if !found {
		return "", "", false
	}
	service, id, found = strings.Cut(rest, "/")
	if !found || service == "" || id == "" || strings.Contains(id, "/") {
		return "", "", false
	}
	return service, id, true
}
