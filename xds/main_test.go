package xds_test

import (
	"os"
	"testing"

	"go.uber.org/goleak"

	"github.com/regcluster/registry/internal/etcdtest"
)

// TestMain checks that no test leaves a goroutine behind (the xDS child
// process, whose grpc xDS client is process-wide, is not checked).
func TestMain(m *testing.M) {
	if os.Getenv("REGISTRY_XDS_CHILD") != "" {
		os.Exit(m.Run())
	}
	goleak.VerifyTestMain(m, etcdtest.LeakOptions()...)
}
