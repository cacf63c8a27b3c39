package integration

import (
	"os/exec"
	"regexp"
	"strings"
	"testing"

	registryv1 "github.com/regcluster/registry/proto/registry/v1"
)

// The checker can fail: with a deliberately broken cache (one that keeps
// instances a reset snapshot no longer holds: deletes lost on reset), the
// compaction scenario reports the violation, naming the subscriber, the
// revision and the key.
func TestCheckerCatchesBrokenCache(t *testing.T) {
	if brokenBuild {
		t.Skip("this is the broken build itself")
	}
	cmd := exec.Command("go", "test", "-tags", "brokencache", "-count=1", "-run", "^TestCompactWhileSubscriberCut$", ".")
	out, err := cmd.CombinedOutput()
	if err == nil {
		t.Fatalf("the suite passed with a broken cache:\n%s", tail(out))
	}
	re := regexp.MustCompile(`violation: subscriber (\w+) at revision (\d+): (/registry/v1/instances/\S+) shown but absent from etcd`)
	m := re.FindSubmatch(out)
	if m == nil {
		t.Fatalf("the broken run failed without the expected violation:\n%s", tail(out))
	}
	t.Logf("the checker reported: subscriber %s at revision %s: %s (a lost delete)", m[1], m[2], m[3])
}

func tail(b []byte) string {
	lines := strings.Split(string(b), "\n")
	var keep []string
	for _, l := range lines {
		if !strings.HasPrefix(l, "{") {
			keep = append(keep, l)
		}
	}
	if len(keep) > 40 {
		keep = keep[len(keep)-40:]
	}
	return strings.Join(keep, "\n")
}

// The drain rule skips a subscriber only when it jumped over the whole
// drain on a new stream (a replay after a reconnect) or through a reset;
// the same jump on one stream is a lost DRAINING.
func TestCheckDrainedSkipsOnlyNewStreams(t *testing.T) {
	const key = "/registry/v1/instances/orders/o-1"
	shown := map[string]ViewInst{key: {ModRev: 10}}
	for _, tc := range []struct {
		name    string
		views   []View
		applied int
		fails   bool
	}{
		{"jump on one stream", []View{{Rev: 10, Insts: shown}, {Rev: 40}}, 1, true},
		{"jump on a new stream", []View{{Rev: 10, Insts: shown}, {Rev: 40, Stream: 1}}, 0, false},
		{"jump through a reset", []View{{Rev: 10, Insts: shown}, {Rev: 40, Reset: true}}, 0, false},
		{"shown draining", []View{{Rev: 10, Insts: shown}, {Rev: 20, Insts: map[string]ViewInst{key: {ModRev: 20, Lifecycle: registryv1.Lifecycle_LIFECYCLE_DRAINING}}}, {Rev: 40}}, 1, false},
		{"new stream, then a view without the drain", []View{{Rev: 10, Insts: shown}, {Rev: 20, Stream: 1, Insts: shown}, {Rev: 40, Stream: 1}}, 1, true},
	} {
		t.Run(tc.name, func(t *testing.T) {
			var rep Report
			if n := checkDrainedViews(&rep, "s", tc.views, key, 20, 30); n != tc.applied {
				t.Errorf("applied %d, want %d", n, tc.applied)
			}
			if failed := len(rep.Violations) > 0; failed != tc.fails {
				t.Errorf("violations %q, want failure %v", rep.Violations, tc.fails)
			}
		})
	}
}
