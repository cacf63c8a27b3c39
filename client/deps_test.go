package client_test

import (
	"os/exec"
	"strings"
	"testing"
)

// The SDK links nothing of etcd (nor zap, which etcd's client brings): an
// application that only registers and subscribes talks to regnode's API
// and must not carry etcd's client. Checked on the package graph itself,
// as the go tool builds it for an application.
func TestClientLinksNoEtcd(t *testing.T) {
	gobin, err := exec.LookPath("go")
	if err != nil {
		t.Fatalf("the go tool is needed to list the SDK's dependencies: %v", err)
	}
	out, err := exec.Command(gobin, "list", "-deps", "github.com/regcluster/registry/client").Output()
	if err != nil {
		t.Fatalf("go list -deps: %v", err)
	}
	deps := strings.Fields(string(out))
	if len(deps) < 10 {
		t.Fatalf("go list -deps printed %d packages; the check would prove nothing: %q", len(deps), out)
	}
	for _, p := range deps {
		if strings.HasPrefix(p, "go.etcd.io/") || strings.HasPrefix(p, "go.uber.org/zap") {
			t.Errorf("package client depends on %s", p)
		}
	}
}
