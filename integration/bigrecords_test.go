package integration

import (
	"bufio"
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"net"
	"os/exec"
	"path/filepath"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	clientv3 "go.etcd.io/etcd/client/v3"
	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials/insecure"
	"google.golang.org/grpc/health"
	healthpb "google.golang.org/grpc/health/grpc_health_v1"
	"google.golang.org/protobuf/types/known/durationpb"

	"github.com/regcluster/registry/internal/chunk"
	"github.com/regcluster/registry/internal/etcdtest"
	registryv1 "github.com/regcluster/registry/proto/registry/v1"
	"github.com/regcluster/registry/record"
)

// buildRegctl builds regctl into the test's temporary folder.
func buildRegctl(t *testing.T) string {
	t.Helper()
	bin := filepath.Join(t.TempDir(), "regctl")
	if out, err := exec.Command("go", "build", "-o", bin, "github.com/regcluster/registry/cmd/regctl").CombinedOutput(); err != nil {
		t.Fatalf("build regctl: %v\n%s", err, out)
	}
	return bin
}

// healthServer is a real gRPC server with the standard health service.
func healthServer(t *testing.T) string {
	t.Helper()
	lis, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	s := grpc.NewServer()
	healthpb.RegisterHealthServer(s, health.NewServer())
	go s.Serve(lis)
	t.Cleanup(s.Stop)
	return lis.Addr().String()
}

// bigInstance is a valid record of about 14 KiB.
func bigInstance(id, addr string) *registryv1.Instance {
	in := &registryv1.Instance{Service: "bigsvc", Id: id, Address: addr, Metadata: map[string]string{}}
	for k := range 14 {
		in.Metadata[fmt.Sprintf("blob%02d", k)] = strings.Repeat(string(rune('a'+k)), 1000)
	}
	return in
}

// registerBig registers ids through api with ttl, eight at a time, and
// returns their leases and the highest revision written.
func registerBig(t *testing.T, api registryv1.RegistryClient, ids []string, addrs []string, ttl time.Duration) ([]int64, int64) {
	t.Helper()
	leases := make([]int64, len(ids))
	revs := make([]int64, len(ids))
	errs := make([]error, len(ids))
	var wg sync.WaitGroup
	sem := make(chan struct{}, 8)
	for i, id := range ids {
		wg.Add(1)
		sem <- struct{}{}
		go func() {
			defer func() { <-sem; wg.Done() }()
			ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
			defer cancel()
			r, err := api.Register(ctx, &registryv1.RegisterRequest{Instance: bigInstance(id, addrs[i%len(addrs)]), Ttl: durationpb.New(ttl)})
			if err != nil {
				errs[i] = fmt.Errorf("register %s: %w", id, err)
				return
			}
			leases[i], revs[i] = r.LeaseId, r.Revision
		}()
	}
	wg.Wait()
	var last int64
	for i := range ids {
		if errs[i] != nil {
			t.Fatal(errs[i])
		}
		last = max(last, revs[i])
	}
	return leases, last
}

func countInEtcd(t *testing.T, cli *clientv3.Client, service string) int64 {
	t.Helper()
	resp, err := cli.Get(context.Background(), record.NewKeys("").Service(service), clientv3.WithPrefix(), clientv3.WithCountOnly())
	if err != nil {
		t.Fatal(err)
	}
	return resp.Count
}

// 1,000 records of about 14 KiB in one service (about 14 MiB, three and a
// half times gRPC's default message limit): regctl list (table and JSON),
// regctl watch, SDK subscriptions and a registry:/// ClientConn all work;
// a subscriber cut off while 400 of them are removed and 400 new ones register
// resumes from the ring (a replay of about 5.7 MiB, in chunks) and every
// view it showed is one etcd had (the fault suite's checker).
func TestThousandLargeRecords(t *testing.T) {
	regctl := buildRegctl(t)
	cl := StartCluster(t, regnodeBin, 1)
	h := RecordHistory(t, cl.Etcd)
	api := newClient(t, cl.APIs()).API()
	backends := []string{healthServer(t), healthServer(t), healthServer(t), healthServer(t)}

	ids := make([]string, 1000)
	for i := range ids {
		ids[i] = fmt.Sprintf("big-%04d", i)
	}
	// 400 whose leases end at the cut, 600 that stay. The 400 are revoked
	// there rather than left to expire: a revoke is what etcd does when a
	// lease expires (one delete per lease), and a short TTL would have
	// them expire while a loaded machine is still registering the rest.
	expiring, _ := registerBig(t, api, ids[:400], backends, time.Hour)
	_, last := registerBig(t, api, ids[400:], backends, time.Hour)
	if n := countInEtcd(t, cl.Etcd, "bigsvc"); n != 1000 {
		t.Fatalf("etcd holds %d instances, want 1000", n)
	}

	// SDK subscriptions: one straight to regnode, one behind a link to cut.
	link := etcdtest.NewProxy(t, cl.Nodes[0].API)
	direct := Follow(t, newClient(t, cl.APIs()), "direct", 0)
	cut := Follow(t, newClient(t, []string{link.Addr()}), "cut", 0)
	for _, s := range []*Subscriber{direct, cut} {
		deadline := time.Now().Add(30 * time.Second)
		for s.Sub.Revision() < last || len(s.Sub.Instances("bigsvc")) != 1000 {
			if time.Now().After(deadline) {
				t.Fatalf("subscriber %s: %d instances at revision %d, want 1000 at %d (last error %v)",
					s.Name, len(s.Sub.Instances("bigsvc")), s.Sub.Revision(), last, s.Sub.LastError())
			}
			time.Sleep(50 * time.Millisecond)
		}
	}

	// regctl list, table and JSON.
	endpoints := "--endpoints=" + strings.Join(cl.APIs(), ",")
	start := time.Now()
	out, err := exec.Command(regctl, endpoints, "list", "bigsvc").Output()
	listTook := time.Since(start)
	if err != nil {
		t.Fatalf("regctl list bigsvc: %v (%s)", err, stderrOf(err))
	}
	if lines := strings.Count(string(out), "\n"); lines != 1001 || !strings.Contains(string(out), "big-0999") {
		t.Fatalf("regctl list bigsvc printed %d lines, want a header and 1000 instances", lines)
	}
	out, err = exec.Command(regctl, endpoints, "-o", "json", "list", "bigsvc").Output()
	if err != nil {
		t.Fatalf("regctl list -o json: %v (%s)", err, stderrOf(err))
	}
	var listed []struct {
		ID       string            `json:"id"`
		Metadata map[string]string `json:"metadata"`
	}
	if err := json.Unmarshal(out, &listed); err != nil {
		t.Fatalf("regctl list -o json: %v", err)
	}
	if len(listed) != 1000 || listed[999].ID != "big-0999" || len(listed[0].Metadata["blob13"]) != 1000 {
		t.Fatalf("regctl list -o json: %d instances", len(listed))
	}

	// regctl watch: its first line is the whole snapshot.
	cmd := exec.Command(regctl, endpoints, "-o", "json", "watch", "bigsvc")
	stdout, err := cmd.StdoutPipe()
	if err != nil {
		t.Fatal(err)
	}
	var werr bytes.Buffer
	cmd.Stderr = &werr
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	line, err := bufio.NewReaderSize(stdout, 1<<20).ReadBytes('\n')
	if err != nil {
		cmd.Process.Kill()
		cmd.Wait()
		t.Fatalf("regctl watch: %v (%s)", err, werr.String())
	}
	var snap struct {
		Type      string            `json:"type"`
		Revision  int64             `json:"revision"`
		Instances []json.RawMessage `json:"instances"`
	}
	if err := json.Unmarshal(line, &snap); err != nil || snap.Type != "snapshot" || len(snap.Instances) != 1000 {
		t.Fatalf("regctl watch first line: type %q, %d instances (%v)", snap.Type, len(snap.Instances), err)
	}
	cmd.Process.Signal(syscall.SIGINT)
	if err := cmd.Wait(); err != nil {
		t.Fatalf("regctl watch on SIGINT: %v (%s)", err, werr.String())
	}

	// A registry:/// ClientConn reaches the instances.
	rc := newClient(t, cl.APIs())
	cc, err := grpc.NewClient("registry:///bigsvc", grpc.WithResolvers(rc.ResolverBuilder()),
		grpc.WithTransportCredentials(insecure.NewCredentials()))
	if err != nil {
		t.Fatal(err)
	}
	defer cc.Close()
	for range 10 {
		ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
		_, err := healthpb.NewHealthClient(cc).Check(ctx, &healthpb.HealthCheckRequest{}, grpc.WaitForReady(true))
		cancel()
		if err != nil {
			t.Fatalf("call through registry:///bigsvc: %v", err)
		}
	}

	// Cut; 400 expire, 400 new register; heal.
	link.Cut()
	cutAt := cut.Sub.Revision()
	var revoked sync.WaitGroup
	sem := make(chan struct{}, 8)
	for _, id := range expiring {
		revoked.Add(1)
		sem <- struct{}{}
		go func() {
			defer func() { <-sem; revoked.Done() }()
			if _, err := cl.Etcd.Revoke(context.Background(), clientv3.LeaseID(id)); err != nil {
				t.Errorf("revoke lease %x: %v", id, err)
			}
		}()
	}
	revoked.Wait()
	deadline := time.Now().Add(30 * time.Second)
	for countInEtcd(t, cl.Etcd, "bigsvc") != 600 {
		if time.Now().After(deadline) {
			t.Fatalf("the 400 were not removed: etcd holds %d", countInEtcd(t, cl.Etcd, "bigsvc"))
		}
		time.Sleep(100 * time.Millisecond)
	}
	fresh := make([]string, 400)
	for i := range fresh {
		fresh[i] = fmt.Sprintf("new-%04d", i)
	}
	_, last = registerBig(t, api, fresh, backends, time.Hour)
	if cut.Sub.Revision() != cutAt {
		t.Fatalf("the cut subscriber moved from %d to %d while cut", cutAt, cut.Sub.Revision())
	}
	resetsBefore := cut.Sub.Stats().Resets
	link.Heal()
	healed := time.Now()
	deadline = time.Now().Add(60 * time.Second)
	for cut.Sub.Revision() < last {
		if time.Now().After(deadline) {
			t.Fatalf("the healed subscriber is stuck at %d, etcd at %d (last error %v)", cut.Sub.Revision(), last, cut.Sub.LastError())
		}
		time.Sleep(50 * time.Millisecond)
	}
	if r := cut.Sub.Stats().Resets; r != resetsBefore {
		t.Errorf("the healed subscriber was reset %d times; the ring holds the 800 missed changes (a replay of %d+ bytes in %d-byte chunks)",
			r-resetsBefore, 400*14<<10, chunk.MaxBytes)
	}
	t.Logf("regctl list of 1,000 records took %s; the healed subscriber caught up on 800 changes in %s",
		listTook.Round(time.Millisecond), time.Since(healed).Round(time.Millisecond))
	if got := len(cut.Sub.Instances("bigsvc")); got != 1000 {
		t.Fatalf("the healed subscriber holds %d instances, want 1000", got)
	}

	// The checker: every view of both subscribers existed in etcd.
	head, err := cl.Etcd.Get(context.Background(), "settle")
	if err != nil {
		t.Fatal(err)
	}
	h.WaitFor(t, max(head.Header.Revision, direct.Sub.Revision(), cut.Sub.Revision()))
	events, upTo := h.Events()
	rep := Check(events, upTo, []*Subscriber{direct, cut}, nil, 0)
	t.Logf("checked %d views against %d etcd events; %d violations", rep.Views, rep.Events, len(rep.Violations))
	for _, v := range rep.Violations {
		t.Errorf("violation: %s", v)
	}
	if rep.Views < 4 {
		t.Errorf("only %d views checked", rep.Views)
	}
}

func stderrOf(err error) string {
	if ee, ok := err.(*exec.ExitError); ok {
		return string(ee.Stderr)
	}
	return ""
}
