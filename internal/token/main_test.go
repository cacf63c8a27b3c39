package token_test

import (
	"testing"

	"go.uber.org/goleak"

	"github.com/regcluster/registry/internal/etcdtest"
)

func TestMain(m *testing.M) { goleak.VerifyTestMain(m, etcdtest.LeakOptions()...) }
