package health

import (
	"errors"
	"testing"
	"time"

	"google.golang.org/protobuf/types/known/durationpb"

	registryv1 "github.com/regcluster/registry/proto/registry/v1"
)

var t0 = time.Date(2025, 1, 1, 0, 0, 0, 0, time.UTC)

// res returns the i-th result of a scripted sequence, one letter a result:
// o OK, s slow (an OK that took 180ms), t timeout, e error (connection
// refused), u unhealthy (HTTP 503), x an unset Outcome. Result i happens at
// t0 + i seconds.
func res(c byte, i int) Result {
	at := t0.Add(time.Duration(i) * time.Second)
	switch c {
	case 'o':
		return Result{Outcome: OK, Latency: 5 * time.Millisecond, At: at}
	case 's':
		return Result{Outcome: OK, Latency: 180 * time.Millisecond, At: at}
	case 't':
		return Result{Outcome: Timeout, Latency: 500 * time.Millisecond, Detail: "timeout after 500ms", At: at}
	case 'e':
		return Result{Outcome: Error, Latency: time.Millisecond, Detail: "connection refused", At: at}
	case 'u':
		return Result{Outcome: Unhealthy, Latency: 3 * time.Millisecond, Detail: "HTTP 503", At: at}
	case 'x':
		return Result{At: at}
	}
	panic("bad script letter " + string(c))
}

// step is an expected transition: caused by result i of the script.
type step struct {
	i      int
	to     registryv1.HealthState
	reason string
}

func TestMachineTransitions(t *testing.T) {
	const (
		slowDetail = "took 180ms, over the 100ms slow threshold"
	)
	tests := []struct {
		name   string
		th     *Thresholds // nil: the defaults
		from   registryv1.HealthState
		script string
		want   []step
		// the state and counters (failures, successes) at the end
		end         registryv1.HealthState
		fails, succ int
	}{
		// UNKNOWN (never seen healthy): the first answer decides; failures
		// before it lead to UNAVAILABLE after N=3, never to DEGRADED.
		{name: "first ok", from: unknown, script: "o",
			want: []step{{0, healthy, "first probe ok"}}, end: healthy},
		{name: "first slow", from: unknown, script: "s",
			want: []step{{0, degraded, "first probe slow: " + slowDetail}}, end: degraded},
		{name: "first timeout stays unknown", from: unknown, script: "t", end: unknown, fails: 1},
		{name: "never healthy 3 timeouts", from: unknown, script: "ttt",
			want: []step{{2, unavailable, "never healthy: 3 consecutive timeouts after 500ms"}}, end: unavailable},
		{name: "never healthy 3 errors", from: unknown, script: "eee",
			want: []step{{2, unavailable, "never healthy: 3 consecutive errors: connection refused"}}, end: unavailable},
		{name: "never healthy 3 unhealthy", from: unknown, script: "uuu",
			want: []step{{2, unavailable, "never healthy: 3 consecutive unhealthy answers: HTTP 503"}}, end: unavailable},
		{name: "never healthy mixed", from: unknown, script: "teu",
			want: []step{{2, unavailable, "never healthy: 3 consecutive failures (1 timeout, 1 error, 1 unhealthy answer), last unhealthy: HTTP 503"}}, end: unavailable},
		{name: "never healthy stays unavailable", from: unknown, script: "eeeeeeee",
			want: []step{{2, unavailable, "never healthy: 3 consecutive errors: connection refused"}}, end: unavailable, fails: 5},
		{name: "failures then first ok", from: unknown, script: "eeo",
			want: []step{{2, healthy, "first probe ok"}}, end: healthy},
		{name: "failures then first slow", from: unknown, script: "ees",
			want: []step{{2, degraded, "first probe slow: " + slowDetail}}, end: degraded},
		{name: "never healthy recovers through degraded", from: unknown, script: "eeeooooo",
			want: []step{{2, unavailable, "never healthy: 3 consecutive errors: connection refused"},
				{7, degraded, "5 consecutive responses after being unavailable"}}, end: degraded},
		{name: "never healthy, threshold 1", th: &Thresholds{1, 5, 3, 5, 100 * time.Millisecond}, from: unknown, script: "t",
			want: []step{{0, unavailable, "first probe timed out after 500ms"}}, end: unavailable},

		// HEALTHY -> DEGRADED after N=3 failed or slow results.
		{name: "healthy 3 timeouts", from: healthy, script: "ttt",
			want: []step{{2, degraded, "3 consecutive timeouts after 500ms"}}, end: degraded},
		{name: "healthy 3 errors", from: healthy, script: "eee",
			want: []step{{2, degraded, "3 consecutive errors: connection refused"}}, end: degraded},
		{name: "healthy 3 unhealthy", from: healthy, script: "uuu",
			want: []step{{2, degraded, "3 consecutive unhealthy answers: HTTP 503"}}, end: degraded},
		{name: "healthy 3 slow", from: healthy, script: "sss",
			want: []step{{2, degraded, "3 consecutive slow responses: " + slowDetail}}, end: degraded},
		{name: "healthy slow and failures mix", from: healthy, script: "set",
			want: []step{{2, degraded, "3 consecutive failed or slow probes (1 slow response, 1 timeout, 1 error), last timeout after 500ms"}},
			end:  degraded},
		{name: "healthy 2 failures stay", from: healthy, script: "tt", end: healthy, fails: 2},
		{name: "healthy ok resets the failure run", from: healthy, script: "ttotte", // 2, reset, 3
			want: []step{{5, degraded, "3 consecutive failures (2 timeouts, 1 error), last error: connection refused"}}, end: degraded},
		{name: "healthy ok resets, no transition", from: healthy, script: "ssoss", end: healthy, fails: 2},
		{name: "healthy oks count", from: healthy, script: "tooo", end: healthy, succ: 3},

		// DEGRADED -> UNAVAILABLE after M=5 failures; slow is not one.
		{name: "degraded 5 unhealthy", from: degraded, script: "uuuuu",
			want: []step{{4, unavailable, "5 consecutive unhealthy answers: HTTP 503"}}, end: unavailable},
		{name: "degraded 5 mixed failures", from: degraded, script: "tttee",
			want: []step{{4, unavailable, "5 consecutive failures (3 timeouts, 2 errors), last error: connection refused"}}, end: unavailable},
		{name: "degraded 4 failures stay", from: degraded, script: "eeee", end: degraded, fails: 4},
		{name: "degraded slow breaks the failure run", from: degraded, script: "eeeese", end: degraded, fails: 1},
		{name: "degraded slow never counts toward M", from: degraded, script: "ssssssssss", end: degraded},
		{name: "degraded ok breaks the failure run", from: degraded, script: "eeeeoe", end: degraded, fails: 1},

		// DEGRADED -> HEALTHY after K=3 successes; slow breaks the run.
		{name: "degraded 3 successes", from: degraded, script: "ooo",
			want: []step{{2, healthy, "3 consecutive successes"}}, end: healthy},
		{name: "degraded slow breaks the success run", from: degraded, script: "oosoo", end: degraded, succ: 2},
		{name: "degraded failure breaks the success run", from: degraded, script: "ooeoo", end: degraded, succ: 2},
		{name: "degraded success after slow", from: degraded, script: "oosooo",
			want: []step{{5, healthy, "3 consecutive successes"}}, end: healthy},

		// UNAVAILABLE -> DEGRADED after L=5 responses, never straight to HEALTHY.
		{name: "unavailable 5 oks", from: unavailable, script: "ooooo",
			want: []step{{4, degraded, "5 consecutive responses after being unavailable"}}, end: degraded},
		{name: "unavailable slow counts as a response", from: unavailable, script: "ososo",
			want: []step{{4, degraded, "5 consecutive responses after being unavailable (2 slow responses)"}}, end: degraded},
		{name: "unavailable error breaks the response run", from: unavailable, script: "ooooe", end: unavailable, fails: 1},
		{name: "unavailable error then 5", from: unavailable, script: "ooooeooooo",
			want: []step{{9, degraded, "5 consecutive responses after being unavailable"}}, end: degraded},
		{name: "unavailable timeout breaks the run", from: unavailable, script: "sssstssss", end: unavailable, succ: 4},
		{name: "unavailable failures stay", from: unavailable, script: "tetutetu", end: unavailable, fails: 8},
		{name: "unavailable recovers through degraded", from: unavailable, script: "oooooooo",
			want: []step{{4, degraded, "5 consecutive responses after being unavailable"}, {7, healthy, "3 consecutive successes"}},
			end:  healthy},

		// Counters restart on every transition.
		{name: "degrading failures do not count toward M", from: healthy, script: "tttetet",
			want: []step{{2, degraded, "3 consecutive timeouts after 500ms"}}, end: degraded, fails: 4},
		{name: "whole cycle", from: unknown, script: "oeeeuuuuuoooooooo",
			want: []step{
				{0, healthy, "first probe ok"},
				{3, degraded, "3 consecutive errors: connection refused"},
				{8, unavailable, "5 consecutive unhealthy answers: HTTP 503"},
				{13, degraded, "5 consecutive responses after being unavailable"},
				{16, healthy, "3 consecutive successes"},
			}, end: healthy},

		// Thresholds of 1, and unset outcomes.
		{name: "all thresholds 1", th: &Thresholds{1, 1, 1, 1, 100 * time.Millisecond}, from: healthy, script: "eeoo",
			want: []step{
				{0, degraded, "error: connection refused"},
				{1, unavailable, "error: connection refused"},
				{2, degraded, "a response after being unavailable"},
				{3, healthy, "probe succeeded"},
			}, end: healthy},
		{name: "unset outcome is an error", from: healthy, script: "xxx",
			want: []step{{2, degraded, "3 consecutive errors: invalid probe outcome(0)"}}, end: degraded},
		{name: "unset outcome first", from: unknown, script: "xxx",
			want: []step{{2, unavailable, "never healthy: 3 consecutive errors: invalid probe outcome(0)"}}, end: unavailable},
		{name: "invalid stored state starts unknown", from: registryv1.HealthState(42), script: "o",
			want: []step{{0, healthy, "first probe ok"}}, end: healthy},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			th := DefaultThresholds()
			if tc.th != nil {
				th = *tc.th
			}
			since := t0.Add(-time.Hour)
			m := NewMachine(th, tc.from, since)
			var got []step
			for i := range len(tc.script) {
				prev := m.State()
				r := res(tc.script[i], i)
				tr, ok := m.Observe(r)
				if !ok {
					if m.State() != prev {
						t.Fatalf("result %d: state changed %v -> %v without a transition", i, prev, m.State())
					}
					continue
				}
				if tr.From != prev || tr.To != m.State() || !tr.At.Equal(r.At) || !m.Since().Equal(r.At) || m.Reason() != tr.Reason {
					t.Fatalf("result %d: transition %+v inconsistent with machine (state %v since %v reason %q)", i, tr, m.State(), m.Since(), m.Reason())
				}
				if f, s := m.Counters(); f != 0 || s != 0 {
					t.Fatalf("result %d: counters (%d, %d) after a transition, want (0, 0)", i, f, s)
				}
				got = append(got, step{i, tr.To, tr.Reason})
			}
			if len(got) != len(tc.want) {
				t.Fatalf("transitions = %v, want %v", got, tc.want)
			}
			for i := range got {
				if got[i] != tc.want[i] {
					t.Errorf("transition %d = %+v, want %+v", i, got[i], tc.want[i])
				}
			}
			if m.State() != tc.end {
				t.Errorf("end state %v, want %v", m.State(), tc.end)
			}
			if f, s := m.Counters(); f != tc.fails || s != tc.succ {
				t.Errorf("end counters (%d, %d), want (%d, %d)", f, s, tc.fails, tc.succ)
			}
			if len(got) == 0 && !m.Since().Equal(since) {
				t.Errorf("since moved to %v without a transition", m.Since())
			}
		})
	}
}

func TestMachineIsAValue(t *testing.T) {
	m := NewMachine(DefaultThresholds(), healthy, t0)
	m.Observe(res('e', 0))
	m.Observe(res('e', 1))
	saved := m // a copy: its runs must not move with m
	if _, ok := m.Observe(res('e', 2)); !ok {
		t.Fatal("third error did not degrade")
	}
	if saved.State() != healthy {
		t.Fatalf("copy changed state to %v", saved.State())
	}
	if f, _ := saved.Counters(); f != 2 {
		t.Fatalf("copy has %d failures, want 2", f)
	}
	if tr, ok := saved.Observe(res('t', 2)); !ok || tr.Reason != "3 consecutive failures (1 timeout, 2 errors), last timeout after 500ms" {
		t.Fatalf("copy: %v %v", tr, ok)
	}
}

func TestTransitionString(t *testing.T) {
	tr := Transition{From: healthy, To: degraded, Reason: "3 consecutive successes"}
	if got, want := tr.String(), "HEALTHY -> DEGRADED: 3 consecutive successes"; got != want {
		t.Fatalf("String() = %q, want %q", got, want)
	}
}

func TestThresholds(t *testing.T) {
	d := DefaultThresholds()
	if d != (Thresholds{3, 5, 3, 5, 100 * time.Millisecond}) {
		t.Fatalf("defaults %+v", d)
	}
	if err := d.Validate(); err != nil {
		t.Fatalf("defaults invalid: %v", err)
	}
	bad := Thresholds{0, 101, -1, 100, 0}
	err := bad.Validate()
	if err == nil {
		t.Fatal("invalid thresholds accepted")
	}
	want := "health: Thresholds.FailuresToDegraded must be 1..100, got 0\n" +
		"health: Thresholds.FailuresToUnavailable must be 1..100, got 101\n" +
		"health: Thresholds.SuccessesToHealthy must be 1..100, got -1\n" +
		"health: Thresholds.Slow must be > 0, got 0s"
	if err.Error() != want || !errors.Is(err, ErrInvalidThresholds) {
		t.Fatalf("Validate() =\n%v\nwant\n%v wrapping ErrInvalidThresholds", err, want)
	}
	for _, ok := range []Thresholds{{1, 1, 1, 1, 1}, {MaxCount, MaxCount, MaxCount, MaxCount, time.Hour}} {
		if err := ok.Validate(); err != nil {
			t.Errorf("%+v (the bounds): %v", ok, err)
		}
	}
}

func TestThresholdsWith(t *testing.T) {
	d := DefaultThresholds()
	if got := d.With(nil); got != d {
		t.Fatalf("With(nil) = %+v", got)
	}
	if got := d.With(&registryv1.HealthCheck{}); got != d {
		t.Fatalf("With(empty) = %+v", got)
	}
	spec := &registryv1.HealthCheck{
		FailuresToDegraded:  2,
		SuccessesToDegraded: 7,
		SlowThreshold:       durationpb.New(250 * time.Millisecond),
	}
	want := Thresholds{2, 5, 3, 7, 250 * time.Millisecond}
	if got := d.With(spec); got != want {
		t.Fatalf("With = %+v, want %+v", got, want)
	}
	huge := d.With(&registryv1.HealthCheck{FailuresToUnavailable: 1 << 31})
	if huge.Validate() == nil {
		t.Fatal("an override of 2^31 validated")
	}
}

func TestClassify(t *testing.T) {
	slow := 100 * time.Millisecond
	for _, tc := range []struct {
		in   Result
		want Result
	}{
		{Result{Outcome: OK, Latency: 100 * time.Millisecond}, Result{Outcome: OK, Latency: 100 * time.Millisecond}},
		{Result{Outcome: OK, Latency: 180*time.Millisecond + 400*time.Microsecond},
			Result{Outcome: Slow, Latency: 180*time.Millisecond + 400*time.Microsecond, Detail: "took 180ms, over the 100ms slow threshold"}},
		{Result{Outcome: Error, Latency: time.Second, Detail: "x"}, Result{Outcome: Error, Latency: time.Second, Detail: "x"}},
		{Result{Outcome: Timeout, Latency: time.Second}, Result{Outcome: Timeout, Latency: time.Second}},
	} {
		got := Classify(tc.in, slow)
		if got != tc.want {
			t.Errorf("Classify(%+v) = %+v, want %+v", tc.in, got, tc.want)
		}
		if again := Classify(got, slow); again != got {
			t.Errorf("Classify not idempotent: %+v then %+v", got, again)
		}
	}
	if got := Classify(Result{Outcome: OK, Latency: time.Hour}, 0); got.Outcome != OK {
		t.Errorf("slow 0 classified %v", got.Outcome)
	}
}

func TestOutcomeString(t *testing.T) {
	for o, want := range map[Outcome]string{OK: "ok", Slow: "slow", Timeout: "timeout", Error: "error", Unhealthy: "unhealthy", 0: "outcome(0)", 9: "outcome(9)"} {
		if got := o.String(); got != want {
			t.Errorf("%d.String() = %q, want %q", int(o), got, want)
		}
	}
	for o, want := range map[Outcome]bool{OK: false, Slow: false, Timeout: true, Error: true, Unhealthy: true, 0: true} {
		if got := o.Failure(); got != want {
			t.Errorf("%v.Failure() = %v, want %v", o, got, want)
		}
	}
}

func TestFormatDuration(t *testing.T) {
	for d, want := range map[time.Duration]string{
		180*time.Millisecond + 499*time.Microsecond: "180ms",
		1500 * time.Millisecond:                     "1.5s",
		1234567 * time.Nanosecond:                   "1ms",
		999567 * time.Nanosecond:                    "1ms",
		432123 * time.Nanosecond:                    "432µs",
		0:                                           "0s",
	} {
		if got := FormatDuration(d); got != want {
			t.Errorf("FormatDuration(%d) = %q, want %q", d, got, want)
		}
	}
}
