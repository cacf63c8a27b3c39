package xds_test

import (
	"context"
	"fmt"
	"math"
	"os"
	"os/exec"
	"path/filepath"
	"testing"
	"time"

	"google.golang.org/protobuf/types/known/durationpb"
	"google.golang.org/protobuf/types/known/timestamppb"

	"github.com/regcluster/registry/client"
	"github.com/regcluster/registry/internal/regnodetest"
	registryv1 "github.com/regcluster/registry/proto/registry/v1"
	"github.com/regcluster/registry/store"
)

// requirePeersEnv, set to 1 (as .ci/run does), makes a missing peer
// runtime a failure instead of a skip.
const requirePeersEnv = "REGISTRY_REQUIRE_XDS_PEERS"

// peersDir holds the peers' programs, and Node's package.json and
// package-lock.json (node_modules is installed there, not committed).
var peersDir = filepath.Join("testdata", "peers")

// missing skips t for a peer runtime that is not installed, or fails it
// when the peers are required.
func missing(t *testing.T, format string, args ...any) {
	t.Helper()
	msg := fmt.Sprintf(format, args...)
	if os.Getenv(requirePeersEnv) == "1" {
		t.Fatalf("%s (%s=1)", msg, requirePeersEnv)
	}
	t.Skip(msg)
}

// pythonWithGRPC is a Python that imports grpc: Debian's /usr/bin/python3
// with python3-grpcio first (the python3 first on PATH may be another one,
// e.g. pyenv's, which does not see Debian's dist-packages), then PATH's.
func pythonWithGRPC(t *testing.T) string {
	t.Helper()
	var tried []string
	for _, py := range []string{"/usr/bin/python3", "python3"} {
		path, err := exec.LookPath(py)
		if err != nil {
			continue
		}
		out, err := exec.Command(path, "-c", "import grpc; print(grpc.__version__)").CombinedOutput()
		if err == nil {
			t.Logf("python peer: %s, grpcio %s", path, bytesTrim(out))
			return path
		}
		tried = append(tried, fmt.Sprintf("%s: %s", path, bytesTrim(out)))
	}
	missing(t, "no python3 that imports grpc (apt-get install python3-grpcio); tried %q", tried)
	return ""
}

// nodeWithXDS is node, with @grpc/grpc-js-xds installed in peersDir from
// its package-lock.json (npm ci, if node_modules is missing).
func nodeWithXDS(t *testing.T) string {
	t.Helper()
	node, err := exec.LookPath("node")
	if err != nil {
		missing(t, "no node on PATH")
	}
	if _, err := os.Stat(filepath.Join(peersDir, "node_modules", "@grpc", "grpc-js-xds")); err != nil {
		npm, err := exec.LookPath("npm")
		if err != nil {
			missing(t, "no node_modules in %s and no npm to install them", peersDir)
		}
		ctx, cancel := context.WithTimeout(context.Background(), 5*time.Minute)
		defer cancel()
		cmd := exec.CommandContext(ctx, npm, "ci", "--no-audit", "--no-fund")
		cmd.Dir = peersDir
		if out, err := cmd.CombinedOutput(); err != nil {
			missing(t, "npm ci in %s: %v\n%s", peersDir, err, out)
		}
	}
	probe := exec.Command(node, "-p", "require('@grpc/grpc-js-xds/package.json').version")
	probe.Dir = peersDir
	out, err := probe.CombinedOutput()
	if err != nil {
		missing(t, "node cannot load @grpc/grpc-js-xds from %s: %v\n%s", peersDir, err, out)
	}
	t.Logf("node peer: %s, @grpc/grpc-js-xds %s", node, bytesTrim(out))
	return node
}

// buildRegctl builds regctl for regctlBootstrap.
func buildRegctl(t *testing.T) string {
	t.Helper()
	bin := filepath.Join(t.TempDir(), "regctl")
	if out, err := exec.Command("go", "build", "-o", bin, "../cmd/regctl").CombinedOutput(); err != nil {
		t.Fatalf("go build regctl: %v\n%s", err, out)
	}
	return bin
}

// regctlBootstrap is the bootstrap `regctl xds bootstrap` (the binary
// bin) prints for the regnode at addr: the peers run on what the docs
// tell users to give them.
func regctlBootstrap(t *testing.T, bin, addr string) []byte {
	t.Helper()
	cmd := exec.Command(bin, "--endpoints", addr, "xds", "bootstrap")
	cmd.Env = append(os.Environ(), "REGCTL_CACERT=", "REGCTL_CERT=", "REGCTL_KEY=")
	out, err := cmd.Output()
	if err != nil {
		t.Fatalf("regctl xds bootstrap: %v", err)
	}
	return out
}

func bytesTrim(b []byte) string {
	for len(b) > 0 && (b[len(b)-1] == '\n' || b[len(b)-1] == ' ') {
		b = b[:len(b)-1]
	}
	return string(b)
}

// xDS clients in other languages, real ones, follow a service through a
// real regnode with nothing but a bootstrap file: Python's grpcio
// (Debian's python3-grpcio, C-core's xDS) and Node's @grpc/grpc-js-xds
// (pinned in testdata/peers/package-lock.json), each a child process
// calling grpc.health.v1.Health/Check on real gRPC backends through
// xds:///SERVICE. Weights 100/100/200 give shares 25/25/50 (±7 points
// over 2,000 calls); a drained instance gets no new call once the client
// applied the drain; an UNAVAILABLE one leaves.
func TestXDSPeersFollowTheRegistry(t *testing.T) {
	peers := []struct {
		name    string
		command func(t *testing.T, service string) *exec.Cmd
	}{
		{"python", func(t *testing.T, service string) *exec.Cmd {
			return exec.Command(pythonWithGRPC(t), filepath.Join(peersDir, "client.py"), service)
		}},
		{"node", func(t *testing.T, service string) *exec.Cmd {
			node := nodeWithXDS(t)
			cmd := exec.Command(node, "client.js", service)
			cmd.Dir = peersDir
			return cmd
		}},
	}
	regctl := buildRegctl(t)
	rn := regnodetest.Start(t)
	c, err := client.New(client.Config{Endpoints: []string{rn.Addr}})
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	api := c.API()
	st, err := store.New(store.Config{Client: rn.Etcd, Prefix: rn.Prefix})
	if err != nil {
		t.Fatal(err)
	}
	for _, p := range peers {
		t.Run(p.name, func(t *testing.T) {
			service := "orders-" + p.name
			cmd := p.command(t, service)
			ctx := context.Background()
			bs := []*backend{startBackend(t), startBackend(t), startBackend(t)}
			weights := []uint32{100, 100, 200}
			for i, b := range bs {
				if _, err := api.Register(ctx, &registryv1.RegisterRequest{Ttl: durationpb.New(time.Minute), Instance: &registryv1.Instance{
					Service: service, Id: fmt.Sprintf("b%d", i), Address: b.addr, Weight: weights[i]}}); err != nil {
					t.Fatal(err)
				}
			}
			counts := func() []int64 {
				out := make([]int64, len(bs))
				for i, b := range bs {
					out[i] = b.calls.Load()
				}
				return out
			}
			call := startChild(t, cmd, regctlBootstrap(t, regctl, rn.Addr))
			if r := call(1); r.Failed != 0 {
				t.Fatalf("first xDS call: %s", r.Err)
			}
			// The first call may come before every locality is ready: wait
			// until each backend has served one.
			waitFor(t, 30*time.Second, "every backend called", func() bool {
				call(20)
				for _, n := range counts() {
					if n == 0 {
						return false
					}
				}
				return true
			})

			before := counts()
			const n = 2000
			if r := call(n); r.Failed != 0 {
				t.Fatalf("%d of %d xDS calls failed: %s", r.Failed, n, r.Err)
			}
			after := counts()
			for i, want := range []float64{25, 25, 50} {
				got := float64(after[i]-before[i]) * 100 / n
				t.Logf("b%d (weight %d): %.1f%% of the calls", i, weights[i], got)
				if math.Abs(got-want) > 7 {
					t.Errorf("b%d (weight %d) got %.1f%% of the calls, want %.0f±7", i, weights[i], got, want)
				}
			}

			// Drained: once the client applied it, b2 gets no new call.
			if _, err := api.Drain(ctx, &registryv1.DrainRequest{Service: service, Id: "b2"}); err != nil {
				t.Fatal(err)
			}
			waitFor(t, 30*time.Second, "the drain applied", func() bool {
				b2 := bs[2].calls.Load()
				call(20)
				return bs[2].calls.Load() == b2
			})
			b2 := bs[2].calls.Load()
			if r := call(200); r.Failed != 0 || bs[2].calls.Load() != b2 {
				t.Fatalf("after the drain: %+v, b2 got %d calls", r, bs[2].calls.Load()-b2)
			}

			// UNAVAILABLE (written as the prober writes it): b1 leaves, b0
			// takes every call (one routable of two: not below the panic
			// threshold).
			if _, _, err := st.Update(ctx, service, "b1", func(in *registryv1.Instance) error {
				in.Health = &registryv1.Health{State: registryv1.HealthState_HEALTH_STATE_UNAVAILABLE, Since: timestamppb.Now(), Reason: "test"}
				return nil
			}); err != nil {
				t.Fatal(err)
			}
			waitFor(t, 30*time.Second, "UNAVAILABLE b1 gone", func() bool {
				b1 := bs[1].calls.Load()
				call(20)
				return bs[1].calls.Load() == b1
			})
			before = counts()
			if r := call(200); r.Failed != 0 {
				t.Fatalf("after b1 left: %+v", r)
			}
			if after := counts(); after[0]-before[0] != 200 {
				t.Fatalf("after b1 left: calls %v -> %v, want all 200 on b0", before, after)
			}
		})
	}
}
