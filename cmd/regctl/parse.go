package main

import (
	"errors"
	"fmt"
	"strings"
	"time"

	"google.golang.org/protobuf/types/known/durationpb"

	"github.com/regcluster/registry/internal/checkspec"
	registryv1 "github.com/regcluster/registry/proto/registry/v1"
	"github.com/regcluster/registry/record"
)

// Output formats of -o.
const (
	outTable = "table"
	outWide  = "wide"
	outJSON  = "json"
)

// parseOutput checks the value of -o.
func parseOutput(s string) (string, error) {
	switch s {
	case outTable, outWide, outJSON:
		return s, nil
	}
	return "", usagef("invalid -o %q: must be table, wide or json", s)
}

// parseEndpoints splits a comma-separated list of regnode host:port
// addresses, dropping empty entries.
func parseEndpoints(s string) ([]string, error) {
	var eps []string
	for _, ep := range strings.Split(s, ",") {
		ep = strings.TrimSpace(ep)
		if ep == "" {
			continue
		}
		if err := record.ValidAddress(ep); err != nil {
			return nil, usagef("invalid endpoint %q: %s", ep, reason(err))
		}
		eps = append(eps, ep)
	}
	if len(eps) == 0 {
		return nil, usagef("no endpoints given")
	}
	return eps, nil
}

// parseServiceID splits a SERVICE/ID argument and validates both halves
// with the registry's own rules.
func parseServiceID(arg string) (service, id string, err error) {
	service, id, ok := strings.Cut(arg, "/")
	if !ok {
		return "", "", usagef("%q is not SERVICE/ID", arg)
	}
	if err := record.ValidService(service); err != nil {
		return "", "", usagef("%q is not SERVICE/ID: %v", arg, err)
	}
	if err := record.ValidID(id); err != nil {
		return "", "", usagef("%q is not SERVICE/ID: %v", arg, err)
	}
	return service, id, nil
}

// parseService validates a SERVICE argument.
func parseService(arg string) (string, error) {
	if err := record.ValidService(arg); err != nil {
		return "", usagef("%v", err)
	}
	return arg, nil
}

// parseMeta turns repeated --meta k=v values into a map. A value may
// contain '='; the key may not be empty or repeated.
func parseMeta(kvs []string) (map[string]string, error) {
	if len(kvs) == 0 {
		return nil, nil
	}
	md := make(map[string]string, len(kvs))
	for _, kv := range kvs {
		k, v, ok := strings.Cut(kv, "=")
		if !ok {
			return nil, usagef("invalid --meta %q: must be key=value", kv)
		}
		if k == "" {
			return nil, usagef("invalid --meta %q: empty key", kv)
		}
		if _, dup := md[k]; dup {
			return nil, usagef("invalid --meta %q: key %q given twice", kv, k)
		}
		if err := record.ValidMetadata(k, v); err != nil {
			return nil, usagef("invalid --meta %q: %s", kv, reason(err))
		}
		md[k] = v
	}
	if len(md) > record.MaxMetadata {
		return nil, usagef("%d --meta entries, at most %d", len(md), record.MaxMetadata)
	}
	return md, nil
}

// reason is why the registry's rules refuse a value, without the field's
// name (the caller names the flag instead).
func reason(err error) string {
	var fe *record.FieldError
	if errors.As(err, &fe) {
		return fe.Reason
	}
	return err.Error()
}

// flagOf is the register flag that sets each record field the registry's
// rules name.
var flagOf = map[string]string{
	"service": "--service", "id": "--id", "address": "--address", "zone": "--zone",
	"version": "--version", "weight": "--weight", "metadata": "--meta", "ttl": "--ttl",
	"check.kind": "--check", "check.target": "--check", "check.interval": "--check-interval",
	"check.timeout": "--check-timeout", "drain_grace": "--drain-grace",
}

// fieldUsage makes a value the registry's rules refuse a usage error (exit
// 2: the command line is wrong, nothing is sent) naming the flag that was
// given and, as the regnode would, the record's field
// ("--weight: invalid weight: ...").
func fieldUsage(err error) error {
	if err == nil {
		return nil
	}
	var fe *record.FieldError
	if errors.As(err, &fe) {
		if flag, ok := flagOf[fe.Field]; ok {
			return usagef("%s: %v", flag, err)
		}
	}
	return usagef("%v", err)
}

// validWeight checks a --weight given on the command line: 1..1000, as
// its help says (0, the registry's "default", is not a weight to type).
func validWeight(w uint32) error {
	if w < record.MinWeight || w > record.MaxWeight {
		return fieldUsage(&record.FieldError{Field: "weight", Reason: fmt.Sprintf("%d is outside %d..%d", w, record.MinWeight, record.MaxWeight)})
	}
	return nil
}

// validTTL checks a --ttl given on the command line: 2s..1h (0, the
// registry's "default", is not a TTL to type).
func validTTL(ttl time.Duration) error {
	if ttl == 0 {
		return fieldUsage(&record.FieldError{Field: "ttl", Reason: fmt.Sprintf("0s is outside %s..%s", record.MinTTL, record.MaxTTL)})
	}
	return fieldUsage(record.ValidTTL(ttl))
}

// parseCheck turns --check tcp|http:PATH|grpc[:SERVICE]|none and the
// optional --check-interval and --check-timeout (nil when not given) into
// a HealthCheck; nil means no check. The prober's target is always the
// instance's own address.
func parseCheck(spec string, interval, timeout *time.Duration) (*registryv1.HealthCheck, error) {
	if spec == "" || spec == "none" {
		if interval != nil || timeout != nil {
			return nil, usagef("--check-interval and --check-timeout need --check")
		}
		return nil, nil
	}
	c, err := checkspec.Parse(spec)
	if err != nil {
		return nil, usagef("invalid --check %v", err)
	}
	if interval != nil {
		if *interval <= 0 {
			return nil, usagef("invalid --check-interval %s: must be positive", *interval)
		}
		c.Interval = durationpb.New(*interval)
	}
	if timeout != nil {
		if *timeout <= 0 {
			return nil, usagef("invalid --check-timeout %s: must be positive", *timeout)
		}
		c.Timeout = durationpb.New(*timeout)
	}
	return c, nil
}
