package client

import (
	"errors"
	"reflect"
	"testing"
	"time"

	"github.com/regcluster/registry/internal/configerr/configtest"
	"github.com/regcluster/registry/record"
)

func TestConfigValidate(t *testing.T) {
	badPolicy := DefaultPolicy()
	badPolicy.MaxEjectionPercent = 101
	ok, bad := configtest.Accepts[Config], configtest.Refuses[Config]
	configtest.Run(t, DefaultConfig, Config.Validate, ErrInvalidConfig, []configtest.Case[Config]{
		ok("Endpoints empty (default)", func(c *Config) { c.Endpoints = nil }),
		ok("Endpoints with spaces", func(c *Config) { c.Endpoints = []string{" 10.0.0.1:7400 ", "regnode-2:7400"} }),
		bad("Endpoints without a port", "Endpoints", func(c *Config) { c.Endpoints = []string{"10.0.0.1"} }),
		ok("Policy nil (default)", func(c *Config) { c.Policy = nil }),
		bad("Policy invalid", "Policy", func(c *Config) { c.Policy = &badPolicy }),
		ok("Policies valid", func(c *Config) { c.Policies = map[string]Policy{"orders": DefaultPolicy()} }),
		bad("Policies bad service", `Policies["Not A Name"]`, func(c *Config) { c.Policies = map[string]Policy{"Not A Name": DefaultPolicy()} }),
		bad("Policies bad policy", `Policies["orders"]`, func(c *Config) { c.Policies = map[string]Policy{"orders": badPolicy} }),
		ok("CacheMaxAge 0 (default)", func(c *Config) { c.CacheMaxAge = 0 }),
		bad("CacheMaxAge -1ns", "CacheMaxAge", func(c *Config) { c.CacheMaxAge = -1 }),
		ok("CloseTimeout 0 (default)", func(c *Config) { c.CloseTimeout = 0 }),
		ok("CloseTimeout 1ns", func(c *Config) { c.CloseTimeout = 1 }),
		bad("CloseTimeout -1ns", "CloseTimeout", func(c *Config) { c.CloseTimeout = -1 }),
		bad("Token malformed", "Token", func(c *Config) { c.Token = "not-a-token" }),
	})
}

func TestSubscribeOptionsValidate(t *testing.T) {
	ok, bad := configtest.Accepts[SubscribeOptions], configtest.Refuses[SubscribeOptions]
	configtest.Run(t, DefaultSubscribeOptions, SubscribeOptions.Validate, ErrInvalidConfig, []configtest.Case[SubscribeOptions]{
		ok("Changes 0 (no channel)", func(o *SubscribeOptions) { o.Changes = 0 }),
		ok("Changes 1", func(o *SubscribeOptions) { o.Changes = 1 }),
		bad("Changes -1", "Changes", func(o *SubscribeOptions) { o.Changes = -1 }),
		ok("CallbackBacklog 0 (default)", func(o *SubscribeOptions) { o.CallbackBacklog = 0 }),
		ok("CallbackBacklog 1", func(o *SubscribeOptions) { o.CallbackBacklog = 1 }),
		bad("CallbackBacklog -1", "CallbackBacklog", func(o *SubscribeOptions) { o.CallbackBacklog = -1 }),
		ok("MinBackoff 0 (default)", func(o *SubscribeOptions) { o.MinBackoff = 0 }),
		bad("MinBackoff -1ns", "MinBackoff", func(o *SubscribeOptions) { o.MinBackoff = -1 }),
		ok("MaxBackoff = MinBackoff", func(o *SubscribeOptions) { o.MaxBackoff = o.MinBackoff }),
		bad("MaxBackoff < MinBackoff", "MaxBackoff", func(o *SubscribeOptions) { o.MaxBackoff = o.MinBackoff - 1 }),
		ok("MaxBackoff 0 under a MinBackoff over its default", func(o *SubscribeOptions) { o.MinBackoff, o.MaxBackoff = time.Minute, 0 }),
		ok("ReceiveDeadline 0 (default)", func(o *SubscribeOptions) { o.ReceiveDeadline = 0 }),
		ok("ReceiveDeadline at MinReceiveDeadline", func(o *SubscribeOptions) { o.ReceiveDeadline = MinReceiveDeadline }),
		bad("ReceiveDeadline below MinReceiveDeadline", "ReceiveDeadline", func(o *SubscribeOptions) { o.ReceiveDeadline = MinReceiveDeadline - 1 }),
	})
}

func TestRegisterOptionsValidate(t *testing.T) {
	ok, bad := configtest.Accepts[RegisterOptions], configtest.Refuses[RegisterOptions]
	configtest.Run(t, DefaultRegisterOptions, RegisterOptions.Validate, ErrInvalidConfig, []configtest.Case[RegisterOptions]{
		ok("TTL 0 (default)", func(o *RegisterOptions) { o.TTL = 0 }),
		ok("TTL at MinTTL", func(o *RegisterOptions) { o.TTL = record.MinTTL }),
		bad("TTL below MinTTL", "TTL", func(o *RegisterOptions) { o.TTL = record.MinTTL - 1 }),
		ok("TTL at MaxTTL", func(o *RegisterOptions) { o.TTL = record.MaxTTL }),
		bad("TTL above MaxTTL", "TTL", func(o *RegisterOptions) { o.TTL = record.MaxTTL + 1 }),
		ok("DrainGrace 0 (default)", func(o *RegisterOptions) { o.DrainGrace = 0 }),
		bad("DrainGrace -1ns", "DrainGrace", func(o *RegisterOptions) { o.DrainGrace = -1 }),
	})
}

// The zero values run with the stated defaults; the SDK's refusals are
// still record.ErrInvalid and a *record.FieldError naming the field.
func TestConfigDefaults(t *testing.T) {
	got := Config{}.withDefaults()
	got.Logger = nil
	if want := DefaultConfig(); !reflect.DeepEqual(got, want) {
		t.Errorf("zero Config runs with %+v, DefaultConfig is %+v", got, want)
	}
	if got, want := (SubscribeOptions{}).withDefaults(), DefaultSubscribeOptions(); !reflect.DeepEqual(got, want) {
		t.Errorf("zero SubscribeOptions run with %+v, DefaultSubscribeOptions is %+v", got, want)
	}
	eps := []string{" 127.0.0.1:1 "}
	_ = Config{Endpoints: eps}.withDefaults()
	if eps[0] != " 127.0.0.1:1 " {
		t.Errorf("withDefaults changed the caller's Endpoints: %q", eps)
	}
	err := SubscribeOptions{MaxBackoff: -time.Second}.Validate()
	var fe *record.FieldError
	if !errors.Is(err, record.ErrInvalid) || !errors.As(err, &fe) || fe.Field != "SubscribeOptions.MaxBackoff" ||
		err.Error() != "client: SubscribeOptions.MaxBackoff must be >= MinBackoff 50ms (0: the default), got -1s" {
		t.Errorf("SubscribeOptions{MaxBackoff: -1s}: %v (FieldError %+v)", err, fe)
	}
}
