package deploy

import (
	"errors"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"strings"
	"syscall"
	"testing"
)

// passesStartChecks runs regnode with args and env as they are (0.0.0.0
// listeners included) on a data dir the test holds locked. regnode checks
// its whole configuration (flags, TLS, the rule that a plaintext listener
// beyond loopback needs --insecure) before it takes its data dir, and
// takes the data dir before it binds anything: so exit 1 saying the data
// dir is held means every check passed, with nothing bound or written,
// and exit 2 is a configuration regnode refuses to start with.
func passesStartChecks(t *testing.T, what string, args, env []string, dataDir string) {
	t.Helper()
	if err := os.MkdirAll(dataDir, 0o700); err != nil {
		t.Fatal(err)
	}
	f, err := os.OpenFile(filepath.Join(dataDir, "regnode.lock"), os.O_RDWR|os.O_CREATE, 0o600)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	if err := syscall.Flock(int(f.Fd()), syscall.LOCK_EX|syscall.LOCK_NB); err != nil {
		t.Fatal(err)
	}
	cmd := exec.Command(regnodeBin, args...)
	cmd.Env = env
	cmd.Dir = t.TempDir()
	out, err := cmd.CombinedOutput()
	var ee *exec.ExitError
	if !errors.As(err, &ee) || ee.ExitCode() != 1 || !strings.Contains(string(out), "is held by another process") {
		t.Errorf("%s: regnode %s\nwant it past its checks (exit 1 at the held data dir), got %v:\n%s", what, strings.Join(args, " "), err, out)
	}
}

// TestDeployFilesPassRegnodesChecks runs regnode with the exact command
// lines of the Kubernetes manifest and of the Dockerfile: a pod or a
// container must not be refused at start (TestStatefulSetFormsACluster
// moves the listeners to loopback addresses, where a plaintext listener
// needs no --insecure, so it cannot see this).
func TestDeployFilesPassRegnodesChecks(t *testing.T) {
	sts := statefulSet(t)
	c := sts.Spec.Template.Spec.Containers[0]
	root := t.TempDir()
	name := sts.Name + "-0"
	env := map[string]string{}
	var environ []string
	for _, e := range c.Env {
		v := e.Value
		if e.ValueFrom != nil && e.ValueFrom.FieldRef != nil {
			switch e.ValueFrom.FieldRef.FieldPath {
			case "metadata.name":
				v = name
			case "metadata.namespace":
				v = "ns"
			}
		}
		v = expand(v, env)
		env[e.Name] = v
		environ = append(environ, e.Name+"="+v)
	}
	var args []string
	dataDir := ""
	for _, a := range append(append([]string{}, c.Command...), c.Args...) {
		a = expand(a, env)
		for _, m := range c.VolumeMounts {
			a = strings.ReplaceAll(a, "="+m.MountPath+"/", "="+root+"/")
		}
		if d, ok := strings.CutPrefix(a, "--data-dir="); ok {
			dataDir = d
		}
		args = append(args, a)
	}
	if dataDir == "" || !strings.HasPrefix(dataDir, root) {
		t.Fatalf("the manifest's --data-dir is not on its volume: %q", args)
	}
	passesStartChecks(t, "the StatefulSet's pod", args, environ, dataDir)

	df := string(readFile(t, "Dockerfile"))
	var entry, cmd string
	for _, line := range strings.Split(strings.ReplaceAll(df, "\\\n", " "), "\n") {
		instr, rest, _ := strings.Cut(strings.TrimSpace(line), " ")
		switch strings.ToUpper(instr) {
		case "ENTRYPOINT":
			entry = rest
		case "CMD":
			cmd = rest
		}
	}
	quoted := regexp.MustCompile(`"([^"]+)"`)
	var dargs []string
	dataDir = ""
	for _, m := range quoted.FindAllStringSubmatch(entry+" "+cmd, -1)[1:] { // [0] is the binary
		a := strings.ReplaceAll(m[1], "=/var/lib/regnode/", "="+root+"/docker/")
		if d, ok := strings.CutPrefix(a, "--data-dir="); ok {
			dataDir = d
		}
		dargs = append(dargs, a)
	}
	if dataDir == "" {
		t.Fatalf("the Dockerfile's CMD gives no --data-dir under /var/lib/regnode: %q", dargs)
	}
	passesStartChecks(t, "the Dockerfile's container", dargs, nil, dataDir)
}
