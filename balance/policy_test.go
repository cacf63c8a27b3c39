package balance_test

import (
	"encoding/json"
	"errors"
	"strings"
	"testing"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials/insecure"

	"github.com/regcluster/registry/balance"
)

// The JSON entry overlays the defaults, round-trips, and is validated
// where grpc-go parses it: a bad entry makes the channel refuse the
// config, naming the field.
func TestPolicyJSON(t *testing.T) {
	p, err := balance.ParsePolicy([]byte(`{"picker":"wrr","slowStartWindow":"1m","idempotent":["/pkg.S/*"]}`))
	if err != nil {
		t.Fatal(err)
	}
	want := balance.DefaultPolicy()
	want.Picker, want.SlowStartWindow, want.Idempotent = balance.PickerWRR, time.Minute, []string{"/pkg.S/*"}
	if !equalJSON(t, p, want) {
		t.Fatalf("parsed %+v, want %+v", p, want)
	}
	if !p.IsIdempotent("/pkg.S/Get") || p.IsIdempotent("/pkg.T/Get") {
		t.Fatal("wildcard idempotent")
	}
	js, err := json.Marshal(want)
	if err != nil {
		t.Fatal(err)
	}
	back, err := balance.ParsePolicy(js)
	if err != nil || !equalJSON(t, back, want) {
		t.Fatalf("round trip: %+v, %v", back, err)
	}
	for js, field := range map[string]string{
		`{"picker":"random"}`:            "picker",
		`{"maxEjectionPercent":101}`:     "maxEjectionPercent",
		`{"maxRetries":-1}`:              "maxRetries",
		`{"slowStartWindow":"soon"}`:     "soon",
		`{"consecutiveFailure":3}`:       "consecutiveFailure",
		`{"idempotent":["Get"]}`:         "idempotent",
		`{"baseEjection":"0s"}`:          "baseEjection",
		`{"retryBudgetWindow":"100ms"}`:  "retryBudgetWindow",
		`{"maxEjection":"1s"}`:           "maxEjection",
		`{"halfOpenSuccesses":0}`:        "halfOpenSuccesses",
		`{"panicThresholdPercent":200}`:  "panicThresholdPercent",
		`{"retryBackoffMax":"1ms"}`:      "retryBackoffMax",
		`{"retryBudgetPercent":-5}`:      "retryBudgetPercent",
		`{"consecutiveFailures":0}`:      "consecutiveFailures",
		`{"retryBudgetMinPerSecond":-1}`: "retryBudgetMinPerSecond",
	} {
		if _, err := balance.ParsePolicy([]byte(js)); !errors.Is(err, balance.ErrInvalidPolicy) || !strings.Contains(err.Error(), field) {
			t.Errorf("%s: %v", js, err)
		}
		_, err := grpc.NewClient("passthrough:///x", grpc.WithTransportCredentials(insecure.NewCredentials()),
			grpc.WithDefaultServiceConfig(`{"loadBalancingConfig":[{"`+balance.Name+`":`+js+`}]}`))
		if err == nil || !strings.Contains(err.Error(), field) {
			t.Errorf("channel took %s: %v", js, err)
		}
	}
}

func equalJSON(t *testing.T, a, b balance.Policy) bool {
	t.Helper()
	ja, _ := json.Marshal(a)
	jb, _ := json.Marshal(b)
	return string(ja) == string(jb)
}
