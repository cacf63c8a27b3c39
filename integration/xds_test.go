package integration

import (
	"bufio"
	"context"
	"encoding/json"
	"fmt"
	"net"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials/insecure"
	"google.golang.org/grpc/health"
	healthpb "google.golang.org/grpc/health/grpc_health_v1"
	"google.golang.org/grpc/resolver"
	"google.golang.org/grpc/resolver/manual"
	"google.golang.org/protobuf/types/known/durationpb"

	_ "google.golang.org/grpc/xds" // the xds:/// resolver and its balancers

	"github.com/regcluster/registry/client"
	registryv1 "github.com/regcluster/registry/proto/registry/v1"
)

// xdsCalls is the xDS child's answer to "call N".
type xdsCalls struct {
	OK, Failed int
	Err        string
}

// TestXDSFailoverChild is the helper process of TestXDSClientsSurviveARegnodeKilled:
// grpc-go's xDS client whose bootstrap names one management server,
// "regnodes:///all", a target this process resolves to every regnode
// (REGISTRY_XDS_REGNODES), so its xDS channel moves to another regnode
// when its own goes; "call N" makes N calls to xds:///orders.
func TestXDSFailoverChild(t *testing.T) {
	if os.Getenv("REGISTRY_XDS_CHILD") == "" {
		t.Skip("helper process of TestXDSClientsSurviveARegnodeKilled")
	}
	r := manual.NewBuilderWithScheme("regnodes")
	var addrs []resolver.Address
	for _, a := range strings.Split(os.Getenv("REGISTRY_XDS_REGNODES"), ",") {
		addrs = append(addrs, resolver.Address{Addr: a})
	}
	r.InitialState(resolver.State{Addresses: addrs})
	resolver.Register(r)
	cc, err := grpc.NewClient("xds:///orders", grpc.WithTransportCredentials(insecure.NewCredentials()))
	if err != nil {
		t.Fatal(err)
	}
	defer cc.Close()
	hc := healthpb.NewHealthClient(cc)
	enc := json.NewEncoder(os.Stdout)
	in := bufio.NewScanner(os.Stdin)
	for in.Scan() {
		n, _ := strconv.Atoi(strings.TrimPrefix(in.Text(), "call "))
		var rep xdsCalls
		for range n {
			ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
			_, err := hc.Check(ctx, &healthpb.HealthCheckRequest{}, grpc.WaitForReady(true))
			cancel()
			if err != nil {
				rep.Failed++
				rep.Err = err.Error()
			} else {
				rep.OK++
			}
		}
		if err := enc.Encode(rep); err != nil {
			t.Fatal(err)
		}
	}
}

// countingBackend is a gRPC health server that counts its calls.
func countingBackend(t *testing.T) (string, *atomic.Int64) {
	t.Helper()
	lis, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	var n atomic.Int64
	srv := grpc.NewServer(grpc.UnaryInterceptor(func(ctx context.Context, req any, _ *grpc.UnaryServerInfo, h grpc.UnaryHandler) (any, error) {
		n.Add(1)
		return h(ctx, req)
	}))
	healthpb.RegisterHealthServer(srv, health.NewServer())
	go srv.Serve(lis)
	t.Cleanup(srv.Stop)
	return lis.Addr().String(), &n
}

// A regnode SIGKILLed under load: the xDS client's calls to the routable
// instances go on without one failing (gRPC keeps its last config while
// its xDS channel reconnects), its xDS channel moves to another regnode,
// and a drain made after the kill reaches it from there (the new regnode
// resends the state: its versions are its own, never the dead one's).
func TestXDSClientsSurviveARegnodeKilled(t *testing.T) {
	cl := StartCluster(t, regnodeBin, 3)
	c, err := client.New(client.Config{Endpoints: []string{cl.Nodes[1].API}})
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	var calls []*atomic.Int64
	for i := range 3 {
		addr, n := countingBackend(t)
		calls = append(calls, n)
		if _, err := c.API().Register(ctx, &registryv1.RegisterRequest{Ttl: durationpb.New(time.Minute),
			Instance: &registryv1.Instance{Service: "orders", Id: fmt.Sprintf("b%d", i), Address: addr}}); err != nil {
			t.Fatal(err)
		}
	}
	boot, _ := json.Marshal(map[string]any{
		"xds_servers": []any{map[string]any{"server_uri": "regnodes:///all", "channel_creds": []any{map[string]string{"type": "insecure"}},
			"server_features": []string{"xds_v3"}}},
		"node": map[string]any{"id": "failover-test"},
	})
	path := filepath.Join(t.TempDir(), "bootstrap.json")
	if err := os.WriteFile(path, boot, 0o600); err != nil {
		t.Fatal(err)
	}
	cmd := exec.Command(os.Args[0], "-test.run=^TestXDSFailoverChild$", "-test.count=1")
	cmd.Env = append(os.Environ(), "REGISTRY_XDS_CHILD=1", "GRPC_XDS_BOOTSTRAP="+path, "REGISTRY_XDS_REGNODES="+strings.Join(cl.APIs(), ","))
	stdin, _ := cmd.StdinPipe()
	stdout, _ := cmd.StdoutPipe()
	var stderr strings.Builder
	cmd.Stderr = &stderr
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { stdin.Close(); _ = cmd.Process.Kill(); _ = cmd.Wait() })
	lines := bufio.NewScanner(stdout)
	call := func(n int) xdsCalls {
		t.Helper()
		fmt.Fprintf(stdin, "call %d\n", n)
		for lines.Scan() {
			var r xdsCalls
			if strings.HasPrefix(lines.Text(), "{") && json.Unmarshal(lines.Bytes(), &r) == nil {
				return r
			}
		}
		t.Fatalf("the xDS child said nothing (stderr: %s)", stderr.String())
		return xdsCalls{}
	}
	if r := call(30); r.Failed != 0 {
		t.Fatalf("before the kill: %+v", r)
	}
	// pick_first: the child's xDS stream is on the first regnode.
	victim := cl.Nodes[0]
	if v := xdsStreams(t, victim.Metrics); v != 1 {
		t.Fatalf("the victim serves %v xDS streams, want the child's", v)
	}
	done := make(chan xdsCalls, 1)
	go func() { done <- call(3000) }()
	for calls[0].Load()+calls[1].Load()+calls[2].Load() < 300 {
		time.Sleep(5 * time.Millisecond)
	}
	cl.Kill(victim)
	if r := <-done; r.Failed != 0 {
		t.Fatalf("calls while a regnode was killed: %d of 3000 failed (%s)", r.Failed, r.Err)
	}
	// A drain made through a live regnode reaches the client.
	if _, err := c.API().Drain(ctx, &registryv1.DrainRequest{Service: "orders", Id: "b0"}); err != nil {
		t.Fatal(err)
	}
	deadline := time.Now().Add(time.Minute)
	for {
		before := calls[0].Load()
		if r := call(30); r.Failed != 0 {
			t.Fatalf("after the kill: %+v", r)
		}
		if calls[0].Load() == before {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("the drain made after the kill never reached the xDS client (its xDS stream did not move)")
		}
	}
	before := calls[0].Load()
	if r := call(300); r.Failed != 0 || calls[0].Load() != before {
		t.Fatalf("after the drain: %+v, b0 got %d calls", r, calls[0].Load()-before)
	}
}

// xdsStreams reads registry_xds_streams{protocol="sotw"} off a regnode's
// /metrics.
func xdsStreams(t *testing.T, metricsAddr string) float64 {
	t.Helper()
	resp, err := http.Get("http://" + metricsAddr + "/metrics")
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	sc := bufio.NewScanner(resp.Body)
	for sc.Scan() {
		if v, ok := strings.CutPrefix(sc.Text(), `registry_xds_streams{protocol="sotw"} `); ok {
			f, _ := strconv.ParseFloat(v, 64)
			return f
		}
	}
	return 0
}
