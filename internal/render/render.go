// Package render is how the registry's records look to people and scripts:
// the JSON form of instances, watch events and regnode status (the snake_case
// field names of docs/architecture.md), and the aligned text tables regctl prints.
//
// The JSON types are plain structs with json tags, so that every command
// that prints a record (list, get, watch, status) prints it the same way, and
// a Go program can decode regctl's output into them. Conventions:
//
//   - enums are their names without the proto prefix: "SERVING",
//     "DRAINING", "STARTING", "HEALTHY", "DEGRADED", "UNAVAILABLE",
//     "UNKNOWN", "TCP", "HTTP", "GRPC", "NONE";
//   - timestamps are RFC 3339 with nanoseconds, in UTC, and left out when
//     unset;
//   - etcd's 64-bit identifiers (lease, member and cluster ids) are
//     lower-case hex strings, as etcdctl prints them, because JSON numbers
//     above 2^53 lose digits in many decoders (jq, JavaScript);
//   - revisions and counts are numbers; lists and maps are never null.
package render

import (
	"strconv"
	"strings"
	"time"

	"google.golang.org/protobuf/types/known/durationpb"
	"google.golang.org/protobuf/types/known/timestamppb"

	registryv1 "github.com/regcluster/registry/proto/registry/v1"
)

// Lifecycle is the name of l without its prefix: "STARTING", "SERVING",
// "DRAINING" or "UNSPECIFIED".
func Lifecycle(l registryv1.Lifecycle) string {
	return strings.TrimPrefix(l.String(), "LIFECYCLE_")
}

// HealthState is the name of s without its prefix: "UNKNOWN", "HEALTHY",
// "DEGRADED" or "UNAVAILABLE".
func HealthState(s registryv1.HealthState) string {
	return strings.TrimPrefix(s.String(), "HEALTH_STATE_")
}

// CheckKind is the name of k without its prefix: "NONE", "TCP", "HTTP" or
// "GRPC".
func CheckKind(k registryv1.CheckKind) string {
	return strings.TrimPrefix(k.String(), "CHECK_KIND_")
}

// HexID formats an etcd lease, member or cluster id the way etcdctl does.
func HexID(id uint64) string { return strconv.FormatUint(id, 16) }

// timeOf converts a protobuf timestamp to a UTC time, the zero time when
// unset.
func timeOf(ts *timestamppb.Timestamp) time.Time {
	if ts == nil {
		return time.Time{}
	}
	return ts.AsTime().UTC()
}

// durationOf formats a protobuf duration the way Go does ("1.5s"), empty
// when unset.
func durationOf(d *durationpb.Duration) string {
	if d == nil {
		return ""
	}
	return d.AsDuration().String()
}
