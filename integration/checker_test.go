package integration

import (
	"os/exec"
	"regexp"
	"strings"
	"testing"
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
