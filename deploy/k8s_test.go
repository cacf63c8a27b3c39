package deploy

import (
	"bytes"
	"fmt"
	"net/url"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"slices"
	"strings"
	"sync"
	"testing"

	appsv1 "k8s.io/api/apps/v1"
	corev1 "k8s.io/api/core/v1"
	policyv1 "k8s.io/api/policy/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"sigs.k8s.io/yaml"
)

var (
	// regnodeBin is regnode built from this repository by TestMain.
	regnodeBin string
	flagsOnce  sync.Once
	flagSet    map[string]bool
	flagsErr   error
)

func TestMain(m *testing.M) {
	dir, err := os.MkdirTemp("", "deploy-regnode-")
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		os.Exit(1)
	}
	regnodeBin = filepath.Join(dir, "regnode")
	build := exec.Command("go", "build", "-o", regnodeBin, "./cmd/regnode")
	build.Dir = ".." // the registry's own module
	if out, err := build.CombinedOutput(); err != nil {
		fmt.Fprintf(os.Stderr, "build regnode: %v\n%s", err, out)
		os.RemoveAll(dir)
		os.Exit(1)
	}
	code := m.Run()
	os.RemoveAll(dir)
	os.Exit(code)
}

// regnodeFlags returns the long flags regnode's --help lists: the flag set
// regnode really accepts.
func regnodeFlags(t *testing.T) map[string]bool {
	t.Helper()
	flagsOnce.Do(func() {
		out, err := exec.Command(regnodeBin, "--help").Output()
		if err != nil {
			flagsErr = fmt.Errorf("regnode --help: %v", err)
			return
		}
		flagSet = map[string]bool{}
		for _, m := range regexp.MustCompile(`(?m)^\s+(?:-\w, )?--([a-z0-9-]+)`).FindAllStringSubmatch(string(out), -1) {
			flagSet[m[1]] = true
		}
		if !flagSet["initial-cluster"] || !flagSet["listen"] {
			flagsErr = fmt.Errorf("regnode --help lists no --listen or --initial-cluster:\n%s", out)
		}
	})
	if flagsErr != nil {
		t.Fatal(flagsErr)
	}
	return flagSet
}

// checkArg reports why a command-line argument is not a flag regnode
// accepts ("" if it is).
func checkArg(flags map[string]bool, arg string) string {
	name, ok := strings.CutPrefix(arg, "--")
	if !ok {
		return "is not a --flag"
	}
	name, _, _ = strings.Cut(name, "=")
	if !flags[name] || name == "help" {
		return "is not a regnode flag"
	}
	return ""
}

// envFlag is the flag a REGNODE_* variable sets ("" if it is not one).
func envFlag(name string) string {
	rest, ok := strings.CutPrefix(name, "REGNODE_")
	if !ok {
		return ""
	}
	return strings.ReplaceAll(strings.ToLower(rest), "_", "-")
}

// manifestDocs splits a multi-document YAML file.
func manifestDocs(t *testing.T, path string) [][]byte {
	t.Helper()
	var docs [][]byte
	for _, d := range regexp.MustCompile(`(?m)^---\s*$`).Split(string(readFile(t, path)), -1) {
		if strings.TrimSpace(regexp.MustCompile(`(?m)^\s*#.*$`).ReplaceAllString(d, "")) != "" {
			docs = append(docs, []byte(d))
		}
	}
	return docs
}

var varRef = regexp.MustCompile(`\$\(([A-Za-z_][A-Za-z0-9_]*)\)`)

// TestStatefulSet parses deploy/k8s/statefulset.yaml strictly into the
// Kubernetes API types (an unknown or misspelt field fails), checks the
// three-member etcd wiring (stable names from the headless service, an
// --initial-cluster naming every pod) and that every flag and REGNODE_*
// variable it gives is one regnode accepts.
func TestStatefulSet(t *testing.T) {
	var (
		sts      *appsv1.StatefulSet
		services = map[string]*corev1.Service{}
		pdb      *policyv1.PodDisruptionBudget
	)
	for i, doc := range manifestDocs(t, "k8s/statefulset.yaml") {
		var tm metav1.TypeMeta
		if err := yaml.Unmarshal(doc, &tm); err != nil {
			t.Fatalf("document %d: %v", i, err)
		}
		var obj any
		switch tm.APIVersion + " " + tm.Kind {
		case "apps/v1 StatefulSet":
			sts = &appsv1.StatefulSet{}
			obj = sts
		case "v1 Service":
			obj = &corev1.Service{}
		case "policy/v1 PodDisruptionBudget":
			pdb = &policyv1.PodDisruptionBudget{}
			obj = pdb
		default:
			t.Fatalf("document %d: unexpected %s %s", i, tm.APIVersion, tm.Kind)
		}
		if err := yaml.UnmarshalStrict(doc, obj); err != nil {
			t.Fatalf("document %d (%s): %v", i, tm.Kind, err)
		}
		if svc, ok := obj.(*corev1.Service); ok {
			services[svc.Name] = svc
		}
	}
	if sts == nil || pdb == nil {
		t.Fatal("want a StatefulSet and a PodDisruptionBudget")
	}
	if sts.Spec.Replicas == nil || *sts.Spec.Replicas != 3 {
		t.Fatalf("replicas %v, want 3", sts.Spec.Replicas)
	}
	replicas := int(*sts.Spec.Replicas)
	peers := services[sts.Spec.ServiceName]
	if peers == nil || peers.Spec.ClusterIP != corev1.ClusterIPNone || !peers.Spec.PublishNotReadyAddresses {
		t.Fatalf("serviceName %q: want a headless Service publishing not-ready addresses, got %+v", sts.Spec.ServiceName, peers)
	}
	labels := sts.Spec.Template.Labels
	for name, svc := range services {
		for k, v := range svc.Spec.Selector {
			if labels[k] != v {
				t.Errorf("service %s selects %s=%s, which the pods do not carry", name, k, v)
			}
		}
	}
	for k, v := range sts.Spec.Selector.MatchLabels {
		if labels[k] != v {
			t.Errorf("selector %s=%s does not match the pod template", k, v)
		}
	}
	if sts.Spec.PodManagementPolicy != appsv1.ParallelPodManagement {
		t.Errorf("podManagementPolicy %q: the first member cannot become ready alone, want Parallel", sts.Spec.PodManagementPolicy)
	}
	pod := sts.Spec.Template.Spec
	if sc := pod.SecurityContext; sc == nil || sc.RunAsNonRoot == nil || !*sc.RunAsNonRoot || sc.RunAsUser == nil || *sc.RunAsUser == 0 {
		t.Errorf("the pod must run as a non-root user: %+v", pod.SecurityContext)
	}
	if len(pod.Containers) != 1 {
		t.Fatalf("%d containers, want 1", len(pod.Containers))
	}
	c := pod.Containers[0]

	flags := regnodeFlags(t)
	defined := map[string]bool{}
	args := map[string]string{}
	for _, e := range c.Env {
		if f := envFlag(e.Name); f != "" {
			if !flags[f] || f == "help" {
				t.Errorf("env %s: regnode has no --%s", e.Name, f)
			}
		}
		for _, ref := range varRef.FindAllStringSubmatch(e.Value, -1) {
			if !defined[ref[1]] {
				t.Errorf("env %s refers to $(%s) before it is defined: Kubernetes would leave it as text", e.Name, ref[1])
			}
		}
		defined[e.Name] = true
	}
	for _, a := range append(slices.Clone(c.Command), c.Args...) {
		if why := checkArg(flags, a); why != "" {
			t.Errorf("arg %q %s", a, why)
			continue
		}
		name, val, _ := strings.Cut(strings.TrimPrefix(a, "--"), "=")
		args[name] = val
		for _, ref := range varRef.FindAllStringSubmatch(a, -1) {
			if !defined[ref[1]] {
				t.Errorf("arg %q refers to $(%s), which the container's env does not define", a, ref[1])
			}
		}
	}
	for _, e := range c.Env {
		if envFlag(e.Name) != "" && args[envFlag(e.Name)] != "" {
			t.Errorf("%s and --%s both given: the flag wins, the variable is dead", e.Name, envFlag(e.Name))
		}
	}

	// The etcd wiring: every pod named, each by its stable DNS name under
	// the headless service, at the port the pod listens for peers on.
	ns := "$(POD_NAMESPACE)"
	if args["name"] != "$(POD_NAME)" {
		t.Errorf("--name %q, want $(POD_NAME) (the member name is the pod's)", args["name"])
	}
	host := func(pod string) string { return pod + "." + sts.Spec.ServiceName + "." + ns + ".svc" }
	var want []string
	for i := range replicas {
		p := fmt.Sprintf("%s-%d", sts.Name, i)
		want = append(want, p+"=http://"+host(p)+":2380")
	}
	if got := args["initial-cluster"]; got != strings.Join(want, ",") {
		t.Errorf("--initial-cluster\n got %s\nwant %s", got, strings.Join(want, ","))
	}
	if got, w := args["initial-advertise-peer-urls"], "http://"+host("$(POD_NAME)")+":2380"; got != w {
		t.Errorf("--initial-advertise-peer-urls %q, want %q", got, w)
	}
	if got, w := args["advertise-client-urls"], "http://"+host("$(POD_NAME)")+":2379"; got != w {
		t.Errorf("--advertise-client-urls %q, want %q", got, w)
	}
	for _, f := range []string{"listen-client-urls", "listen-peer-urls", "initial-cluster"} {
		for _, u := range strings.Split(args[f], ",") {
			_, raw, _ := strings.Cut(u, "=")
			if f != "initial-cluster" {
				raw = u
			}
			if pu, err := url.Parse(strings.ReplaceAll(raw, "$(POD_NAMESPACE)", "ns")); err != nil || pu.Scheme != "http" || pu.Port() == "" {
				t.Errorf("--%s: %q is not an http URL with a port", f, raw)
			}
		}
	}
	ports := map[int32]bool{}
	for _, p := range c.Ports {
		ports[p.ContainerPort] = true
	}
	for _, f := range []string{"listen", "metrics-listen"} {
		_, port, _ := strings.Cut(args[f], ":")
		if !strings.HasPrefix(args[f], "0.0.0.0:") || !ports[atoi(t, port)] {
			t.Errorf("--%s %q: want all interfaces on a declared container port", f, args[f])
		}
	}
	if c.ReadinessProbe == nil || c.ReadinessProbe.GRPC == nil || c.ReadinessProbe.GRPC.Port != atoi(t, strings.TrimPrefix(args["listen"], "0.0.0.0:")) {
		t.Errorf("readiness: want grpc.health.v1 on the API port, got %+v", c.ReadinessProbe)
	}
	mounted := false
	for _, m := range c.VolumeMounts {
		mounted = mounted || strings.HasPrefix(args["data-dir"], m.MountPath+"/")
	}
	if !mounted {
		t.Errorf("--data-dir %q is not on a mounted volume", args["data-dir"])
	}
}

func atoi(t *testing.T, s string) int32 {
	t.Helper()
	var n int32
	if _, err := fmt.Sscan(s, &n); err != nil {
		t.Fatalf("port %q: %v", s, err)
	}
	return n
}

// TestDockerfile checks what can be checked of deploy/Dockerfile without a
// Docker engine: a build stage and a distroless (or scratch) final stage,
// static binaries (CGO_ENABLED=0), a numeric non-root USER, regnode as the
// entrypoint, and default flags regnode accepts.
func TestDockerfile(t *testing.T) {
	df := string(readFile(t, "Dockerfile"))
	// Join continued lines.
	df = strings.ReplaceAll(df, "\\\n", " ")
	var froms, runs []string
	var user, entry, cmd string
	for _, line := range strings.Split(df, "\n") {
		line = strings.TrimSpace(line)
		if line == "" || strings.HasPrefix(line, "#") {
			continue
		}
		instr, rest, _ := strings.Cut(line, " ")
		switch strings.ToUpper(instr) {
		case "FROM":
			froms = append(froms, rest)
		case "RUN":
			runs = append(runs, rest)
		case "USER":
			user = rest
		case "ENTRYPOINT":
			entry = rest
		case "CMD":
			cmd = rest
		}
	}
	if len(froms) < 2 {
		t.Fatalf("want a multi-stage build, got FROM %q", froms)
	}
	final := froms[len(froms)-1]
	if !strings.Contains(final, "distroless/static") && !strings.HasPrefix(final, "scratch") {
		t.Errorf("final stage %q: want distroless/static or scratch (a static binary needs no more)", final)
	}
	builds := 0
	for _, r := range runs {
		for _, part := range strings.Split(r, "&&") {
			if strings.Contains(part, "go build") {
				builds++
				if !strings.Contains(part, "CGO_ENABLED=0") {
					t.Errorf("go build without CGO_ENABLED=0: %q", part)
				}
			}
		}
	}
	if builds < 2 {
		t.Errorf("%d go builds, want regnode and regctl", builds)
	}
	uid, _, _ := strings.Cut(user, ":")
	if uid == "" || uid == "0" || strings.Trim(uid, "0123456789") != "" {
		t.Errorf("USER %q: want a numeric non-root uid (runAsNonRoot can check only numbers)", user)
	}
	if !strings.Contains(entry, "/regnode") {
		t.Errorf("ENTRYPOINT %q: want regnode", entry)
	}
	flags := regnodeFlags(t)
	for _, m := range regexp.MustCompile(`"([^"]+)"`).FindAllStringSubmatch(cmd, -1) {
		if why := checkArg(flags, m[1]); why != "" {
			t.Errorf("CMD %q %s", m[1], why)
		}
	}
	if !bytes.Contains([]byte(cmd), []byte("--listen=0.0.0.0:")) {
		t.Errorf("CMD %q: in a container the API must listen beyond loopback", cmd)
	}
}
