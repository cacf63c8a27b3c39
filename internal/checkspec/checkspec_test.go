package checkspec_test

import (
	"strings"
	"testing"

	"github.com/regcluster/registry/internal/checkspec"
	registryv1 "github.com/regcluster/registry/proto/registry/v1"
)

func TestParse(t *testing.T) {
	for _, c := range []struct {
		spec   string
		kind   registryv1.CheckKind
		target string
		err    string
	}{
		{"", registryv1.CheckKind_CHECK_KIND_NONE, "", ""},
		{"none", registryv1.CheckKind_CHECK_KIND_NONE, "", ""},
		{"tcp", registryv1.CheckKind_CHECK_KIND_TCP, "", ""},
		{"TCP", registryv1.CheckKind_CHECK_KIND_TCP, "", ""},
		{"http:/healthz", registryv1.CheckKind_CHECK_KIND_HTTP, "/healthz", ""},
		{"grpc", registryv1.CheckKind_CHECK_KIND_GRPC, "", ""},
		{"grpc:orders.v1", registryv1.CheckKind_CHECK_KIND_GRPC, "orders.v1", ""},
		{"tcp:80", 0, "", `"tcp:80": tcp takes no target`},
		{"http", 0, "", `"http": must be http:PATH`},
		{"http:healthz", 0, "", `"http:healthz": must be http:PATH`},
		{"grpc:", 0, "", "needs a service name"},
		{"icmp", 0, "", "must be tcp, http:PATH, grpc[:SERVICE] or none"},
	} {
		hc, err := checkspec.Parse(c.spec)
		if c.err != "" {
			if err == nil || !strings.Contains(err.Error(), c.err) {
				t.Errorf("Parse(%q) = %v, %v; want an error saying %q", c.spec, hc, err, c.err)
			}
			continue
		}
		if err != nil || hc.GetKind() != c.kind || hc.GetTarget() != c.target {
			t.Errorf("Parse(%q) = %v, %v; want %v %q", c.spec, hc, err, c.kind, c.target)
		}
	}
}
