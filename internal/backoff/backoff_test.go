package backoff_test

import (
	"context"
	"math"
	"testing"
	"time"

	"github.com/regcluster/registry/internal/backoff"
)

func TestStepDoublesUpToMax(t *testing.T) {
	e := backoff.Exponential{Min: 100 * time.Millisecond, Max: 5 * time.Second}
	want := []time.Duration{100, 200, 400, 800, 1600, 3200, 5000, 5000}
	for i, w := range want {
		if got := e.Step(i); got != w*time.Millisecond {
			t.Errorf("Step(%d) = %s, want %s", i, got, w*time.Millisecond)
		}
	}
	for _, tc := range []struct {
		name    string
		e       backoff.Exponential
		attempt int
		want    time.Duration
	}{
		{"many attempts do not overflow", e, 1 << 20, 5 * time.Second},
		{"a huge first step is capped", backoff.Exponential{Min: time.Hour, Max: math.MaxInt64}, 100, math.MaxInt64},
		{"a max below min caps min", backoff.Exponential{Min: time.Second, Max: 10 * time.Millisecond}, 0, 10 * time.Millisecond},
		{"no backoff", backoff.Exponential{}, 5, 0},
		{"a negative attempt is the first", e, -1, 100 * time.Millisecond},
	} {
		if got := tc.e.Step(tc.attempt); got != tc.want {
			t.Errorf("%s: Step(%d) = %s, want %s", tc.name, tc.attempt, got, tc.want)
		}
	}
}

// Every wait is in [step/2, step], and waits are spread over that range:
// the point of the jitter is that clients failing together retry apart.
func TestDelayIsJitteredWithinHalfAStep(t *testing.T) {
	e := backoff.Exponential{Min: 100 * time.Millisecond, Max: 2 * time.Second}
	for attempt := range 8 {
		step := e.Step(attempt)
		low, high := step, time.Duration(0)
		for range 200 {
			d := e.Delay(attempt)
			if d < step/2 || d > step {
				t.Fatalf("Delay(%d) = %s, outside [%s, %s]", attempt, d, step/2, step)
			}
			low, high = min(low, d), max(high, d)
		}
		// 200 uniform draws leave less than 1/8 of the range uncovered at
		// either end, except with probability about 2·(7/8)^200 ≈ 5e-12.
		if low > step/2+step/16 || high < step-step/16 {
			t.Errorf("Delay(%d) drew only [%s, %s] of [%s, %s]: not jittered", attempt, low, high, step/2, step)
		}
	}
	if d := (backoff.Exponential{}).Delay(3); d != 0 {
		t.Errorf("zero backoff waits %s", d)
	}
}

func TestSleepEndsWithContext(t *testing.T) {
	ctx, cancel := context.WithCancel(context.Background())
	cancel()
	if backoff.Sleep(ctx, time.Hour) {
		t.Fatal("Sleep of an ended context reported the wait passed")
	}
	if !backoff.Sleep(context.Background(), time.Nanosecond) {
		t.Fatal("Sleep of a live context reported it ended")
	}
}
