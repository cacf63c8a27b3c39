package deploy

import (
	"bufio"
	"fmt"
	"io"
	"net"
	"net/http"
	"os/exec"
	"path/filepath"
	"regexp"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	appsv1 "k8s.io/api/apps/v1"
	"sigs.k8s.io/yaml"
)

// statefulSet is the StatefulSet of deploy/k8s/statefulset.yaml.
func statefulSet(t *testing.T) *appsv1.StatefulSet {
	t.Helper()
	for _, doc := range manifestDocs(t, "k8s/statefulset.yaml") {
		var sts appsv1.StatefulSet
		if err := yaml.UnmarshalStrict(doc, &sts); err == nil && sts.Kind == "StatefulSet" {
			return &sts
		}
	}
	t.Fatal("no StatefulSet in the manifest")
	return nil
}

// expand is Kubernetes' $(VAR) expansion of args and env values.
func expand(s string, env map[string]string) string {
	return varRef.ReplaceAllStringFunc(s, func(ref string) string {
		if v, ok := env[ref[2:len(ref)-1]]; ok {
			return v
		}
		return ref
	})
}

// lockedBuffer collects a process's stderr while the test reads it.
type lockedBuffer struct {
	mu sync.Mutex
	b  strings.Builder
}

func (l *lockedBuffer) add(s string) {
	l.mu.Lock()
	defer l.mu.Unlock()
	l.b.WriteString(s)
}

func (l *lockedBuffer) String() string {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.b.String()
}

// TestStatefulSetFormsACluster runs the manifest's three pods as three
// regnode processes, each on a loopback address of its own standing for
// its pod IP (127.0.0.2, .3, .4; the peers' DNS names resolved to them),
// with exactly the manifest's arguments and environment otherwise. They
// must form one etcd cluster and elect exactly one prober leader, and stop
// with exit 0 on SIGTERM.
func TestStatefulSetFormsACluster(t *testing.T) {
	if testing.Short() {
		t.Skip("starts three regnodes")
	}
	sts := statefulSet(t)
	c := sts.Spec.Template.Spec.Containers[0]
	replicas := int(*sts.Spec.Replicas)
	ip := func(i int) string { return fmt.Sprintf("127.0.0.%d", i+2) }
	ports := []string{"7400", "7401", "2379", "2380"}
	for i := range replicas {
		for _, p := range ports {
			l, err := net.Listen("tcp", net.JoinHostPort(ip(i), p))
			if err != nil {
				t.Skipf("%s:%s is taken here (%v): cannot stand in for pod %d", ip(i), p, err, i)
			}
			l.Close()
		}
	}
	root := t.TempDir()
	started := time.Now() // for the log only: the test waits on conditions
	type pod struct {
		name   string
		cmd    *exec.Cmd
		stderr *lockedBuffer
		done   chan struct{}
	}
	var pods []*pod
	var readers sync.WaitGroup
	defer readers.Wait()
	for i := range replicas {
		name := fmt.Sprintf("%s-%d", sts.Name, i)
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
		for _, a := range append(append([]string{}, c.Command...), c.Args...) {
			a = expand(a, env)
			a = strings.ReplaceAll(a, "0.0.0.0", ip(i))
			for j := range replicas {
				a = strings.ReplaceAll(a, fmt.Sprintf("%s-%d.%s.ns.svc", sts.Name, j, sts.Spec.ServiceName), ip(j))
			}
			for _, m := range c.VolumeMounts {
				a = strings.ReplaceAll(a, "="+m.MountPath+"/", "="+filepath.Join(root, name)+"/")
			}
			args = append(args, a)
		}
		cmd := exec.Command(regnodeBin, args...)
		cmd.Env = environ // the container's environment only
		cmd.Dir = root
		stderr, err := cmd.StderrPipe()
		if err != nil {
			t.Fatal(err)
		}
		if err := cmd.Start(); err != nil {
			t.Fatal(err)
		}
		p := &pod{name: name, cmd: cmd, stderr: &lockedBuffer{}, done: make(chan struct{})}
		readers.Add(1)
		go func() {
			defer readers.Done()
			defer close(p.done)
			sc := bufio.NewScanner(stderr)
			for sc.Scan() {
				p.stderr.add(sc.Text() + "\n")
			}
			_, _ = io.Copy(io.Discard, stderr)
		}()
		pods = append(pods, p)
	}
	stopped := false
	defer func() {
		if !stopped {
			for _, p := range pods {
				_ = p.cmd.Process.Kill()
				<-p.done
				_ = p.cmd.Wait()
			}
		}
	}()

	// Each pod is serving once it says so; then exactly one leads the
	// prober (every regnode reports registry_prober_leader 0 or 1).
	leaderRe := regexp.MustCompile(`(?m)^registry_prober_leader (\S+)$`)
	deadline := time.Now().Add(2 * time.Minute)
	var last string
	for {
		serving, leaders, reported := 0, 0, 0
		for i, p := range pods {
			select {
			case <-p.done:
				t.Fatalf("%s exited while the cluster formed:\n%s", p.name, p.stderr)
			default:
			}
			if !strings.Contains(p.stderr.String(), "registry API on "+ip(i)+":7400") {
				continue
			}
			serving++
			resp, err := http.Get("http://" + ip(i) + ":7401/metrics")
			if err != nil {
				last = err.Error()
				continue
			}
			body, _ := io.ReadAll(resp.Body)
			resp.Body.Close()
			if m := leaderRe.FindSubmatch(body); m != nil {
				reported++
				if v, _ := strconv.ParseFloat(string(m[1]), 64); v == 1 {
					leaders++
				}
			}
		}
		last = fmt.Sprintf("%d serving, %d reporting, %d leading (%s)", serving, reported, leaders, last)
		if serving == replicas && reported == replicas && leaders == 1 {
			t.Logf("%d pods serving, one etcd cluster with one prober leader, %s after the first start", replicas, time.Since(started).Round(10*time.Millisecond))
			break
		}
		if time.Now().After(deadline) {
			for _, p := range pods {
				t.Logf("%s:\n%s", p.name, p.stderr)
			}
			t.Fatalf("no cluster of %d with one prober leader: %s", replicas, last)
		}
		time.Sleep(200 * time.Millisecond)
	}

	stopped = true
	for _, p := range pods {
		_ = p.cmd.Process.Signal(syscall.SIGTERM)
	}
	for _, p := range pods {
		<-p.done
		if err := p.cmd.Wait(); err != nil {
			t.Errorf("%s after SIGTERM: %v\n%s", p.name, err, p.stderr)
		}
	}
}
