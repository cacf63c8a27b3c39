package xds_test

import (
	"bufio"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"math"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	dto "github.com/prometheus/client_model/go"
	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials/insecure"
	"google.golang.org/grpc/health"
	healthpb "google.golang.org/grpc/health/grpc_health_v1"
	"google.golang.org/protobuf/types/known/durationpb"
	"google.golang.org/protobuf/types/known/timestamppb"

	_ "google.golang.org/grpc/xds" // the xds:/// resolver and its balancers

	"github.com/regcluster/registry/client"
	"github.com/regcluster/registry/internal/regnodetest"
	registryv1 "github.com/regcluster/registry/proto/registry/v1"
	"github.com/regcluster/registry/store"
)

// backend is a real gRPC server that counts the calls it serves, each
// taking delay.
type backend struct {
	addr  string
	calls atomic.Int64
	delay atomic.Int64 // nanoseconds
}

func startBackend(t *testing.T) *backend {
	t.Helper()
	lis, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	b := &backend{addr: lis.Addr().String()}
	srv := grpc.NewServer(grpc.UnaryInterceptor(func(ctx context.Context, req any, _ *grpc.UnaryServerInfo, h grpc.UnaryHandler) (any, error) {
		b.calls.Add(1)
		time.Sleep(time.Duration(b.delay.Load()))
		return h(ctx, req)
	}))
	healthpb.RegisterHealthServer(srv, health.NewServer())
	go srv.Serve(lis)
	t.Cleanup(srv.Stop)
	return b
}

// childReport is what the xDS child answers to each "call N".
type childReport struct {
	OK, Failed int
	Err        string
}

// TestXDSChild is the helper process: grpc-go's own xDS client, with
// nothing but a bootstrap file (GRPC_XDS_BOOTSTRAP), calling
// xds:///SERVICE; each line "call N" on stdin makes N calls and answers a
// JSON line.
func TestXDSChild(t *testing.T) {
	service := os.Getenv("REGISTRY_XDS_CHILD")
	if service == "" {
		t.Skip("helper process of the xDS tests")
	}
	cc, err := grpc.NewClient("xds:///"+service, grpc.WithTransportCredentials(insecure.NewCredentials()))
	if err != nil {
		t.Fatal(err)
	}
	defer cc.Close()
	hc := healthpb.NewHealthClient(cc)
	enc := json.NewEncoder(os.Stdout)
	in := bufio.NewScanner(os.Stdin)
	workers := 1 // REGISTRY_XDS_CONCURRENCY: calls in flight at once
	if c, err := strconv.Atoi(os.Getenv("REGISTRY_XDS_CONCURRENCY")); err == nil && c > 0 {
		workers = c
	}
	// REGISTRY_XDS_FAILFAST=1: calls fail at once when there is nothing
	// to call, instead of waiting for it within their deadline.
	waitForReady := os.Getenv("REGISTRY_XDS_FAILFAST") != "1"
	for in.Scan() {
		n, _ := strconv.Atoi(strings.TrimPrefix(in.Text(), "call "))
		var (
			r    childReport
			mu   sync.Mutex
			next atomic.Int64
			wg   sync.WaitGroup
		)
		for range workers {
			wg.Go(func() {
				for next.Add(1) <= int64(n) {
					ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
					_, err := hc.Check(ctx, &healthpb.HealthCheckRequest{}, grpc.WaitForReady(waitForReady))
					cancel()
					mu.Lock()
					if err != nil {
						r.Failed++
						r.Err = err.Error()
					} else {
						r.OK++
					}
					mu.Unlock()
				}
			})
		}
		wg.Wait()
		if err := enc.Encode(r); err != nil {
			t.Fatal(err)
		}
	}
}

// xdsChild starts the helper process with a bootstrap naming the regnode
// at addr (and zone, if any) and returns its "call N".
func xdsChild(t *testing.T, addr, service, zone string) func(n int) childReport {
	t.Helper()
	node := map[string]any{"id": "xds-test-" + zone}
	if zone != "" {
		node["locality"] = map[string]string{"zone": zone}
	}
	boot, _ := json.Marshal(map[string]any{
		"xds_servers": []any{map[string]any{"server_uri": addr, "channel_creds": []any{map[string]string{"type": "insecure"}},
			"server_features": []string{"xds_v3"}}},
		"node": node,
	})
	cmd := exec.Command(os.Args[0], "-test.run=^TestXDSChild$", "-test.count=1")
	cmd.Env = append(os.Environ(), "REGISTRY_XDS_CHILD="+service)
	return startChild(t, cmd, boot)
}

// startChild writes the bootstrap boot to a file, starts cmd with
// GRPC_XDS_BOOTSTRAP naming it, and returns its "call N": cmd reads
// "call N" lines and answers each with a JSON childReport line. The child
// is killed when the test ends.
func startChild(t *testing.T, cmd *exec.Cmd, boot []byte) func(n int) childReport {
	t.Helper()
	path := filepath.Join(t.TempDir(), "bootstrap.json")
	if err := os.WriteFile(path, boot, 0o600); err != nil {
		t.Fatal(err)
	}
	if cmd.Env == nil {
		cmd.Env = os.Environ()
	}
	cmd.Env = append(cmd.Env, "GRPC_XDS_BOOTSTRAP="+path)
	stdin, err := cmd.StdinPipe()
	if err != nil {
		t.Fatal(err)
	}
	stdout, err := cmd.StdoutPipe()
	if err != nil {
		t.Fatal(err)
	}
	var stderr strings.Builder
	var mu sync.Mutex
	cmd.Stderr = writerFunc(func(p []byte) (int, error) { mu.Lock(); defer mu.Unlock(); return stderr.Write(p) })
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		stdin.Close()
		_ = cmd.Process.Kill()
		_ = cmd.Wait()
		if t.Failed() {
			mu.Lock()
			defer mu.Unlock()
			s := stderr.String()
			if len(s) > 8<<10 {
				s = s[len(s)-8<<10:]
			}
			t.Logf("the xDS child %s's stderr ends: %s", filepath.Base(cmd.Path), s)
		}
	})
	lines := bufio.NewScanner(stdout)
	return func(n int) childReport {
		t.Helper()
		if _, err := fmt.Fprintf(stdin, "call %d\n", n); err != nil {
			t.Fatal(err)
		}
		for lines.Scan() {
			var r childReport
			if strings.HasPrefix(lines.Text(), "{") && json.Unmarshal(lines.Bytes(), &r) == nil {
				return r
			}
		}
		mu.Lock()
		defer mu.Unlock()
		t.Fatalf("the xDS child %s said nothing (stderr: %s)", filepath.Base(cmd.Path), stderr.String())
		return childReport{}
	}
}

type writerFunc func([]byte) (int, error)

func (f writerFunc) Write(p []byte) (int, error) { return f(p) }

var _ io.Writer = writerFunc(nil)

// waitFor polls cond until it holds, failing t after d.
func waitFor(t *testing.T, d time.Duration, what string, cond func() bool) {
	t.Helper()
	deadline := time.Now().Add(d)
	for !cond() {
		if time.Now().After(deadline) {
			t.Fatalf("timed out waiting for %s", what)
		}
		time.Sleep(20 * time.Millisecond)
	}
}

// grpc-go's own xDS client follows a service through a real regnode:
// weights 100/100/200 give shares 25/25/50 (±5 points over 4,000 calls);
// a drained instance gets no new call; an UNAVAILABLE one leaves; with
// fewer than half routable the regnode offers every instance (panic,
// counted); a client whose bootstrap names a zone calls only that zone's
// instance while it is routable, and the others once it is drained.
func TestGRPCXDSClientFollowsTheRegistry(t *testing.T) {
	rn := regnodetest.Start(t)
	c, err := client.New(client.Config{Endpoints: []string{rn.Addr}})
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	api := c.API()
	ctx := context.Background()
	bs := []*backend{startBackend(t), startBackend(t), startBackend(t)}
	weights := []uint32{100, 100, 200}
	zones := []string{"za", "za", "zb"}
	for i, b := range bs {
		if _, err := api.Register(ctx, &registryv1.RegisterRequest{Ttl: durationpb.New(time.Minute), Instance: &registryv1.Instance{
			Service: "orders", Id: fmt.Sprintf("b%d", i), Address: b.addr, Weight: weights[i], Zone: zones[i]}}); err != nil {
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
	call := xdsChild(t, rn.Addr, "orders", "")
	if r := call(1); r.Failed != 0 {
		t.Fatalf("first xDS call: %s", r.Err)
	}
	before := counts()
	const n = 4000
	if r := call(n); r.Failed != 0 {
		t.Fatalf("%d of %d xDS calls failed: %s", r.Failed, n, r.Err)
	}
	after := counts()
	for i, want := range []float64{25, 25, 50} {
		got := float64(after[i]-before[i]) * 100 / n
		if math.Abs(got-want) > 5 {
			t.Errorf("b%d (weight %d) got %.1f%% of the calls, want %.0f±5", i, weights[i], got, want)
		}
	}

	// A client in zone zb calls b2 alone while it is routable.
	zcall := xdsChild(t, rn.Addr, "orders", "zb")
	before = counts()
	if r := zcall(200); r.Failed != 0 {
		t.Fatalf("zone client: %s", r.Err)
	}
	if after := counts(); after[2]-before[2] != 200 {
		t.Fatalf("zone zb client: calls %v -> %v, want all 200 on b2", before, after)
	}

	// Drained: a drain waits for both xDS clients' ACKs (WaitApplied, what
	// regctl drain --wait and Registration.Close call), then b2 stops
	// getting calls from either, and the zone client fails over to the
	// other zone. gRPC acknowledges a version once it accepted it; its
	// picker follows a moment later (seen here: 2 calls), which the drain
	// grace of a Registration.Close covers, so the calls are watched until
	// none reaches b2 rather than from the ACK on.
	dr, err := api.Drain(ctx, &registryv1.DrainRequest{Service: "orders", Id: "b2"})
	if err != nil {
		t.Fatal(err)
	}
	wa, err := api.WaitApplied(ctx, &registryv1.WaitAppliedRequest{Service: "orders", Revision: dr.Revision, Timeout: durationpb.New(30 * time.Second)})
	if err != nil || !wa.Done || wa.XdsClients != 2 || wa.XdsPending != 0 {
		t.Fatalf("WaitApplied for the drain: %v, %v; want done with 2 xDS clients", wa, err)
	}
	for _, cl := range []func(int) childReport{call, zcall} {
		waitFor(t, 10*time.Second, "the acknowledged drain in the client's picker", func() bool {
			b2 := bs[2].calls.Load()
			cl(20)
			return bs[2].calls.Load() == b2
		})
		b2 := bs[2].calls.Load()
		if r := cl(200); r.Failed != 0 || bs[2].calls.Load() != b2 {
			t.Fatalf("after the drain was acknowledged: %+v, b2 got %d calls", r, bs[2].calls.Load()-b2)
		}
	}

	// UNAVAILABLE (written as the prober writes it): b1 leaves.
	st, err := store.New(store.Config{Client: rn.Etcd, Prefix: rn.Prefix})
	if err != nil {
		t.Fatal(err)
	}
	setHealth := func(id string, h registryv1.HealthState) {
		t.Helper()
		if _, _, err := st.Update(ctx, "orders", id, func(in *registryv1.Instance) error {
			in.Health = &registryv1.Health{State: h, Since: timestamppb.Now(), Reason: "test"}
			return nil
		}); err != nil {
			t.Fatal(err)
		}
	}
	setHealth("b1", registryv1.HealthState_HEALTH_STATE_UNAVAILABLE)
	waitFor(t, 30*time.Second, "UNAVAILABLE b1 gone", func() bool {
		b1 := bs[1].calls.Load()
		call(20)
		return bs[1].calls.Load() == b1
	})

	// b0 UNAVAILABLE too: none of the two not draining is routable, so the
	// regnode offers both (panic), counted.
	reg := rn.Node.Metrics().Registry
	setHealth("b0", registryv1.HealthState_HEALTH_STATE_UNAVAILABLE)
	waitFor(t, 30*time.Second, "panic: calls to b0 and b1", func() bool {
		before := counts()
		if r := call(100); r.Failed != 0 {
			t.Fatalf("in panic: %s", r.Err)
		}
		after := counts()
		return after[0] > before[0] && after[1] > before[1] && after[2] == before[2]
	})
	if v := gauge(t, reg, "registry_xds_panic_services"); v != 1 {
		t.Errorf("registry_xds_panic_services = %v, want 1", v)
	}
}

// gauge reads a metric of reg with no labels.
func gauge(t *testing.T, reg interface {
	Gather() ([]*dto.MetricFamily, error)
}, name string) float64 {
	t.Helper()
	mfs, err := reg.Gather()
	if err != nil {
		t.Fatal(err)
	}
	for _, mf := range mfs {
		if mf.GetName() == name && len(mf.GetMetric()) == 1 {
			m := mf.GetMetric()[0]
			if g := m.GetGauge(); g != nil {
				return g.GetValue()
			}
			return m.GetCounter().GetValue()
		}
	}
	t.Fatalf("no metric %s", name)
	return 0
}

// A Go client that links the SDK gets its policy, registry_weighted, over
// xDS (the cluster offers it first, gRFC A52): under concurrent load its
// P2C least-request moves calls away from a slow instance of equal
// weight, where gRPC's own round robin (what a client without the SDK
// gets, as the Python and Node peers show) splits them evenly.
func TestSDKClientGetsItsPolicyOverXDS(t *testing.T) {
	rn := regnodetest.Start(t)
	c, err := client.New(client.Config{Endpoints: []string{rn.Addr}})
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	fast, slow := startBackend(t), startBackend(t)
	slow.delay.Store(int64(20 * time.Millisecond))
	for i, b := range []*backend{fast, slow} {
		if _, err := c.API().Register(context.Background(), &registryv1.RegisterRequest{Ttl: durationpb.New(time.Minute),
			Instance: &registryv1.Instance{Service: "orders", Id: fmt.Sprintf("b%d", i), Address: b.addr}}); err != nil {
			t.Fatal(err)
		}
	}
	boot, _ := json.Marshal(map[string]any{
		"xds_servers": []any{map[string]any{"server_uri": rn.Addr, "channel_creds": []any{map[string]string{"type": "insecure"}},
			"server_features": []string{"xds_v3"}}},
		"node": map[string]any{"id": "sdk-policy", "locality": map[string]string{}},
	})
	cmd := exec.Command(os.Args[0], "-test.run=^TestXDSChild$", "-test.count=1")
	cmd.Env = append(os.Environ(), "REGISTRY_XDS_CHILD=orders", "REGISTRY_XDS_CONCURRENCY=8")
	call := startChild(t, cmd, boot)
	if r := call(16); r.Failed != 0 {
		t.Fatalf("first calls: %s", r.Err)
	}
	f0, s0 := fast.calls.Load(), slow.calls.Load()
	if r := call(400); r.Failed != 0 {
		t.Fatalf("%d calls failed: %s", r.Failed, r.Err)
	}
	f, s := fast.calls.Load()-f0, slow.calls.Load()-s0
	t.Logf("fast %d, slow %d", f, s)
	if s*100 > 30*(f+s) {
		t.Fatalf("the slow instance got %d of %d calls, want < 30%%: the client is not on registry_weighted", s, f+s)
	}
}
