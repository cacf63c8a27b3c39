// Package checkspec parses the short form of an instance's health check
// that regctl register --check and the HTTP API's registration take:
// tcp, http:PATH, grpc[:SERVICE] or none. The target is always the
// instance's own address; intervals, timeouts and thresholds are set
// apart (regctl's --check-interval and --check-timeout) or left to the
// prober's defaults.
package checkspec

import (
	"fmt"
	"strings"

	registryv1 "github.com/regcluster/registry/proto/registry/v1"
)

// Parse turns spec into a HealthCheck of its kind and target; "" and
// "none" are no check (nil, nil). The error says what is wrong with spec,
// quoting it, without naming where it came from ("\"http\": must be
// http:PATH with PATH starting with '/'"): the caller names its flag or
// field.
func Parse(spec string) (*registryv1.HealthCheck, error) {
	if spec == "" || spec == "none" {
		return nil, nil
	}
	kind, target, hasTarget := strings.Cut(spec, ":")
	c := &registryv1.HealthCheck{}
	switch strings.ToLower(kind) {
	case "tcp":
		if hasTarget {
			return nil, fmt.Errorf("%q: tcp takes no target (it connects to the instance's address)", spec)
		}
		c.Kind = registryv1.CheckKind_CHECK_KIND_TCP
	case "http":
		if !strings.HasPrefix(target, "/") {
			return nil, fmt.Errorf("%q: must be http:PATH with PATH starting with '/'", spec)
		}
		c.Kind, c.Target = registryv1.CheckKind_CHECK_KIND_HTTP, target
	case "grpc":
		if hasTarget && target == "" {
			return nil, fmt.Errorf("%q: grpc:SERVICE needs a service name", spec)
		}
		c.Kind, c.Target = registryv1.CheckKind_CHECK_KIND_GRPC, target
	default:
		return nil, fmt.Errorf("%q: must be tcp, http:PATH, grpc[:SERVICE] or none", spec)
	}
	return c, nil
}
