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
	"google.golang.org/grpc/stats"
	"google.golang.org/protobuf/types/known/durationpb"

	"github.com/regcluster/registry/client"
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

// recvSizes is a client-side grpc stats handler that keeps the size of
// every message its ClientConn received: what the bound on messages is
// about, measured where it matters (the receiving end), on either path.
type recvSizes struct {
	mu    sync.Mutex
	sizes []int
}

func (r *recvSizes) TagRPC(ctx context.Context, _ *stats.RPCTagInfo) context.Context { return ctx }
func (r *recvSizes) TagConn(ctx context.Context, _ *stats.ConnTagInfo) context.Context {
	return ctx
}
func (r *recvSizes) HandleConn(context.Context, stats.ConnStats) {}

func (r *recvSizes) HandleRPC(_ context.Context, s stats.RPCStats) {
	if in, ok := s.(*stats.InPayload); ok {
		r.mu.Lock()
		r.sizes = append(r.sizes, in.Length)
		r.mu.Unlock()
	}
}

// since returns the largest message received from the from-th on, and
// how many of them were larger than half a chunk (the chunks of a large
// unit: every one but its last is close to chunk.MaxBytes).
func (r *recvSizes) since(from int) (largest, big int) {
	r.mu.Lock()
	defer r.mu.Unlock()
	for _, n := range r.sizes[from:] {
		largest = max(largest, n)
		if n > chunk.MaxBytes/2 {
			big++
		}
	}
	return largest, big
}

func (r *recvSizes) count() int {
	r.mu.Lock()
	defer r.mu.Unlock()
	return len(r.sizes)
}

// sizedClient is an SDK client of endpoints whose received messages are
// measured; watch selects the Watch stream per subscription (the old
// path) instead of the Client's one Subscribe stream.
func sizedClient(t *testing.T, endpoints []string, watch bool) (*client.Client, *recvSizes) {
	r := &recvSizes{}
	c, err := client.New(client.Config{Endpoints: endpoints, WatchPerSubscription: watch,
		DialOptions: []grpc.DialOption{grpc.WithStatsHandler(r)}})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { c.Close() })
	return c, r
}

// maxMessage bounds every message a subscriber receives: a chunk of at
// most chunk.MaxBytes, and the Subscribe stream's envelope around it (the
// service's name, tags and lengths).
const maxMessage = chunk.MaxBytes + 1<<10

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
// view it showed is one etcd had (the fault suite's checker). Subscribers
// ride both the Client's Subscribe stream and a Watch stream per
// subscription, and no message any of them receives is over a chunk.
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

	// SDK subscriptions: one straight to regnode, one behind a link to
	// cut, on the Client's Subscribe stream (the SDK's default) and on a
	// Watch stream per subscription (Config.WatchPerSubscription).
	link := etcdtest.NewProxy(t, cl.Nodes[0].API)
	directC, directSizes := sizedClient(t, cl.APIs(), false)
	cutC, cutSizes := sizedClient(t, []string{link.Addr()}, false)
	directWC, directWSizes := sizedClient(t, cl.APIs(), true)
	cutWC, cutWSizes := sizedClient(t, []string{link.Addr()}, true)
	direct := Follow(t, directC, "direct", 0)
	cut := Follow(t, cutC, "cut", 0)
	directW := Follow(t, directWC, "direct-watch", 0)
	cutW := Follow(t, cutWC, "cut-watch", 0)
	subs := []*Subscriber{direct, cut, directW, cutW}
	sizes := []*recvSizes{directSizes, cutSizes, directWSizes, cutWSizes}
	for _, s := range subs {
		deadline := time.Now().Add(30 * time.Second)
		for s.Sub.Revision() < last || len(s.Sub.Instances("bigsvc")) != 1000 {
			if time.Now().After(deadline) {
				t.Fatalf("subscriber %s: %d instances at revision %d, want 1000 at %d (last error %v)",
					s.Name, len(s.Sub.Instances("bigsvc")), s.Sub.Revision(), last, s.Sub.LastError())
			}
			time.Sleep(50 * time.Millisecond)
		}
	}
	for i, s := range subs {
		largest, big := sizes[i].since(0)
		t.Logf("subscriber %s: the snapshot of 1,000 records came in %d messages over %d bytes, the largest %d bytes",
			s.Name, big, chunk.MaxBytes/2, largest)
		if largest > maxMessage {
			t.Errorf("subscriber %s received a message of %d bytes, over the bound of %d", s.Name, largest, maxMessage)
		}
		if big < 10 {
			t.Errorf("subscriber %s: the ~14 MiB snapshot came in %d messages near %d bytes, want at least 10", s.Name, big, chunk.MaxBytes)
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
	cutAt, cutWAt := cut.Sub.Revision(), cutW.Sub.Revision()
	cutFrom, cutWFrom := cutSizes.count(), cutWSizes.count()
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
	if cut.Sub.Revision() != cutAt || cutW.Sub.Revision() != cutWAt {
		t.Fatalf("the cut subscribers moved from %d and %d to %d and %d while cut", cutAt, cutWAt, cut.Sub.Revision(), cutW.Sub.Revision())
	}
	resetsBefore := []int{cut.Sub.Stats().Resets, cutW.Sub.Stats().Resets}
	link.Heal()
	healed := time.Now()
	for i, s := range []*Subscriber{cut, cutW} {
		deadline = time.Now().Add(60 * time.Second)
		for s.Sub.Revision() < last {
			if time.Now().After(deadline) {
				t.Fatalf("the healed subscriber %s is stuck at %d, etcd at %d (last error %v)", s.Name, s.Sub.Revision(), last, s.Sub.LastError())
			}
			time.Sleep(50 * time.Millisecond)
		}
		if r := s.Sub.Stats().Resets; r != resetsBefore[i] {
			t.Errorf("the healed subscriber %s was reset %d times; the ring holds the 800 missed changes (a replay of %d+ bytes in %d-byte chunks)",
				s.Name, r-resetsBefore[i], 400*14<<10, chunk.MaxBytes)
		}
		if got := len(s.Sub.Instances("bigsvc")); got != 1000 {
			t.Fatalf("the healed subscriber %s holds %d instances, want 1000", s.Name, got)
		}
	}
	t.Logf("regctl list of 1,000 records took %s; the healed subscribers caught up on 800 changes in %s",
		listTook.Round(time.Millisecond), time.Since(healed).Round(time.Millisecond))
	for _, m := range []struct {
		s     *Subscriber
		sizes *recvSizes
		from  int
	}{{cut, cutSizes, cutFrom}, {cutW, cutWSizes, cutWFrom}} {
		largest, big := m.sizes.since(m.from)
		t.Logf("subscriber %s: the replay after the heal came in %d messages over %d bytes, the largest %d bytes",
			m.s.Name, big, chunk.MaxBytes/2, largest)
		if largest > maxMessage {
			t.Errorf("subscriber %s received a message of %d bytes, over the bound of %d", m.s.Name, largest, maxMessage)
		}
	}

	// The checker: every view of both subscribers existed in etcd.
	head, err := cl.Etcd.Get(context.Background(), "settle")
	if err != nil {
		t.Fatal(err)
	}
	rev := head.Header.Revision
	for _, s := range subs {
		rev = max(rev, s.Sub.Revision())
	}
	h.WaitFor(t, rev)
	events, upTo := h.Events()
	rep := Check(events, upTo, subs, nil, 0)
	t.Logf("checked %d views against %d etcd events; %d violations", rep.Views, rep.Events, len(rep.Violations))
	for _, v := range rep.Violations {
		t.Errorf("violation: %s", v)
	}
	if rep.Views < 8 {
		t.Errorf("only %d views checked", rep.Views)
	}
}

func stderrOf(err error) string {
	if ee, ok := err.(*exec.ExitError); ok {
		return string(ee.Stderr)
	}
	return ""
}
