package embedded

import (
	"context"
	"errors"
	"os"
	"path/filepath"
	"reflect"
	"testing"
	"time"

	"github.com/regcluster/registry/internal/configerr/configtest"
)

func TestConfigValidate(t *testing.T) {
	ok, bad := configtest.Accepts[Config], configtest.Refuses[Config]
	configtest.Run(t, DefaultConfig, Config.Validate, ErrInvalidConfig, []configtest.Case[Config]{
		ok("ListenClientURLs empty (default)", func(c *Config) { c.ListenClientURLs = nil }),
		bad("ListenClientURLs without a scheme", "ListenClientURLs", func(c *Config) { c.ListenClientURLs = []string{"127.0.0.1:2379"} }),
		ok("AdvertiseClientURLs set", func(c *Config) { c.AdvertiseClientURLs = []string{"http://10.0.0.1:2379"} }),
		bad("AdvertiseClientURLs without a host", "AdvertiseClientURLs", func(c *Config) { c.AdvertiseClientURLs = []string{"http://"} }),
		bad("ListenPeerURLs junk", "ListenPeerURLs", func(c *Config) { c.ListenPeerURLs = []string{"::"} }),
		bad("AdvertisePeerURLs junk", "AdvertisePeerURLs", func(c *Config) { c.AdvertisePeerURLs = []string{"peer"} }),
		ok("ClusterState existing", func(c *Config) { c.ClusterState = "existing" }),
		ok("ClusterState empty (default)", func(c *Config) { c.ClusterState = "" }),
		bad("ClusterState old", "ClusterState", func(c *Config) { c.ClusterState = "old" }),
		ok("ReadyTimeout 0 (default)", func(c *Config) { c.ReadyTimeout = 0 }),
		bad("ReadyTimeout -1ns", "ReadyTimeout", func(c *Config) { c.ReadyTimeout = -1 }),
		ok("ProgressNotifyInterval 0 (default)", func(c *Config) { c.ProgressNotifyInterval = 0 }),
		bad("ProgressNotifyInterval -1ns", "ProgressNotifyInterval", func(c *Config) { c.ProgressNotifyInterval = -1 }),
		ok("QuotaBackendBytes 0 (etcd's)", func(c *Config) { c.QuotaBackendBytes = 0 }),
		bad("QuotaBackendBytes -1", "QuotaBackendBytes", func(c *Config) { c.QuotaBackendBytes = -1 }),
		ok("BcryptCost 0 (etcd's)", func(c *Config) { c.BcryptCost = 0 }),
		bad("BcryptCost -1", "BcryptCost", func(c *Config) { c.BcryptCost = -1 }),
	})
}

// The zero Config runs with DefaultConfig's values (plus those derived
// from them), and Start refuses what Validate refuses before it locks
// the data dir (it used to start a member and time out at once on a
// negative ReadyTimeout).
func TestConfigDefaults(t *testing.T) {
	got := Config{}.withDefaults()
	want := DefaultConfig()
	want.AdvertiseClientURLs, want.AdvertisePeerURLs = want.ListenClientURLs, want.ListenPeerURLs
	want.InitialCluster = "default=http://127.0.0.1:2380"
	if !reflect.DeepEqual(got, want) {
		t.Errorf("zero Config runs with %+v, want %+v", got, want)
	}
	// Under a regular file: should Validate let it through, Start fails
	// to lock it instead of starting a member on the default ports.
	file := filepath.Join(t.TempDir(), "file")
	if err := os.WriteFile(file, nil, 0o600); err != nil {
		t.Fatal(err)
	}
	_, err := Start(context.Background(), Config{Dir: filepath.Join(file, "data"), ReadyTimeout: -time.Second})
	if !errors.Is(err, ErrInvalidConfig) || err.Error() != "embedded: Config.ReadyTimeout must be >= 0 (0: the default), got -1s" {
		t.Errorf("Start: %v", err)
	}
}
