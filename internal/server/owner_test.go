package server_test

import (
	"bytes"
	"context"
	"encoding/json"
	"log/slog"
	"net"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus/testutil"
	clientv3 "go.etcd.io/etcd/client/v3"
	"google.golang.org/genproto/googleapis/rpc/errdetails"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/credentials/insecure"
	"google.golang.org/grpc/peer"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/proto"
	"google.golang.org/protobuf/types/known/durationpb"

	"github.com/regcluster/registry/client"
	"github.com/regcluster/registry/internal/etcdtest"
	"github.com/regcluster/registry/internal/node"
	"github.com/regcluster/registry/internal/peerlimit"
	"github.com/regcluster/registry/internal/regnodetest"
	"github.com/regcluster/registry/internal/secret"
	"github.com/regcluster/registry/internal/server"
	registryv1 "github.com/regcluster/registry/proto/registry/v1"
)

// headRev is etcd's current revision: a refused call must leave it as it was.
func headRev(t *testing.T, cli *clientv3.Client) int64 {
	t.Helper()
	resp, err := cli.Get(context.Background(), "\x00")
	if err != nil {
		t.Fatal(err)
	}
	return resp.Header.Revision
}

// refused asserts err has code, names want in its message, and that etcd
// did not move from rev.
func refused(t *testing.T, rn *regnodetest.Regnode, what string, err error, code codes.Code, want string, rev int64) {
	t.Helper()
	if status.Code(err) != code || !strings.Contains(status.Convert(err).Message(), want) {
		t.Fatalf("%s: %v, want %s naming %q", what, err, code, want)
	}
	if now := headRev(t, rn.Etcd); now != rev {
		t.Fatalf("%s was refused but moved etcd from revision %d to %d", what, rev, now)
	}
}

// electionLease is the lease of the prober leader's election key: the
// session a stranger must not be able to revoke or keep alive.
func electionLease(t *testing.T, rn *regnodetest.Regnode) clientv3.LeaseID {
	t.Helper()
	var id clientv3.LeaseID
	waitFor(t, 20*time.Second, "a prober leader", func() bool {
		resp, err := rn.Etcd.Get(context.Background(), rn.Prefix+"election/", clientv3.WithPrefix())
		if err == nil && len(resp.Kvs) > 0 {
			id = clientv3.LeaseID(resp.Kvs[0].Lease)
		}
		return id != 0
	})
	return id
}

func leaseAlive(t *testing.T, cli *clientv3.Client, id clientv3.LeaseID) bool {
	t.Helper()
	ttl, err := cli.TimeToLive(context.Background(), id)
	if err != nil {
		t.Fatal(err)
	}
	return ttl.TTL > 0
}

// Every attack of issue 10 on a registration, replayed by a stranger who
// can read everything the API shows (the record, its lease id, the
// election session's lease): each is refused with PermissionDenied,
// InvalidArgument or AlreadyExists naming what is missing, and etcd's
// revision does not move. The owner, with its secret, still can.
func TestStrangerCannotActAsOwner(t *testing.T) {
	m := etcdtest.Start(t, false)
	rn := regnodetest.StartWith(t, node.Config{EtcdEndpoints: []string{m.ClientURL}, OperatorDeregister: "none"}, m.ClientURL)
	api := newClient(t, rn.Addr).API()
	ctx := context.Background()
	session := electionLease(t, rn)

	own, err := api.Register(ctx, &registryv1.RegisterRequest{Instance: inst("orders", "o-1"), Ttl: durationpb.New(time.Minute)})
	if err != nil {
		t.Fatal(err)
	}
	if secret.Valid(own.Secret) != nil {
		t.Fatalf("Register returned secret %q", own.Secret)
	}
	// The stranger's own registration: a valid secret, of something else.
	theirs, err := api.Register(ctx, &registryv1.RegisterRequest{Instance: inst("orders", "x-1"), Ttl: durationpb.New(time.Minute)})
	if err != nil {
		t.Fatal(err)
	}

	// Nothing a read returns carries the secret or its hash.
	got, err := api.Get(ctx, &registryv1.GetRequest{Service: "orders", Id: "o-1"})
	if err != nil {
		t.Fatal(err)
	}
	list, err := api.List(ctx, &registryv1.ListRequest{})
	if err != nil {
		t.Fatal(err)
	}
	wctx, wcancel := context.WithCancel(ctx)
	w, err := api.Watch(wctx, &registryv1.WatchRequest{Service: "orders"})
	if err != nil {
		t.Fatal(err)
	}
	snap, err := w.Recv()
	wcancel()
	if err != nil {
		t.Fatal(err)
	}
	for name, m := range map[string]proto.Message{"get": got, "list": list, "watch": snap} {
		b, _ := proto.Marshal(m)
		hash := strings.TrimPrefix(secret.Hash(own.Secret), "sha256:")
		if bytes.Contains(b, []byte(own.Secret)) || bytes.Contains(b, []byte(hash)) {
			t.Fatalf("%s returns the secret or its hash", name)
		}
	}

	// A foreign lease, let run down a little, to see that no attack
	// renews it.
	foreign, err := rn.Etcd.Grant(ctx, 60)
	if err != nil {
		t.Fatal(err)
	}
	waitFor(t, 10*time.Second, "the foreign lease to run down", func() bool {
		ttl, err := rn.Etcd.TimeToLive(ctx, foreign.ID)
		return err == nil && ttl.TTL <= 58
	})

	rev := headRev(t, rn.Etcd)
	// Deregister someone else's instance.
	_, err = api.Deregister(ctx, &registryv1.DeregisterRequest{Service: "orders", Id: "o-1"})
	refused(t, rn, "deregister without the secret", err, codes.PermissionDenied, "secret is required", rev)
	_, err = api.Deregister(ctx, &registryv1.DeregisterRequest{Service: "orders", Id: "o-1", LeaseId: own.LeaseId, Secret: theirs.Secret})
	refused(t, rn, "deregister with another registration's secret", err, codes.PermissionDenied, "secret is not this registration's", rev)
	// Revoke a lease that is not the record's: the election session, with
	// or without a secret of one's own.
	_, err = api.Deregister(ctx, &registryv1.DeregisterRequest{Service: "orders", Id: "o-1", LeaseId: int64(session)})
	refused(t, rn, "deregister naming the election session", err, codes.PermissionDenied, "secret is required", rev)
	dr, err := api.Deregister(ctx, &registryv1.DeregisterRequest{Service: "orders", Id: "x-1", LeaseId: int64(session), Secret: theirs.Secret})
	if err != nil || dr.Deleted {
		t.Fatalf("own deregister naming the election session: %v, %v; want nothing deleted", dr, err)
	}
	if now := headRev(t, rn.Etcd); now != rev || !leaseAlive(t, rn.Etcd, session) {
		t.Fatalf("a deregister naming the election session revoked it or wrote (revision %d -> %d)", rev, now)
	}

	// Take over the live id: no secret, a guessed one, the incarnation a
	// read shows (none: it is not stored), a malformed one.
	takeover := func(sec, incarnation string) error {
		in := inst("orders", "o-1")
		in.Incarnation = incarnation
		_, err := api.Register(ctx, &registryv1.RegisterRequest{Instance: in, Secret: sec})
		return err
	}
	refused(t, rn, "take-over without a secret", takeover("", ""), codes.AlreadyExists, "needs its secret", rev)
	refused(t, rn, "take-over with a guessed secret", takeover(secret.New(), ""), codes.AlreadyExists, "needs its secret", rev)
	refused(t, rn, "take-over with the incarnation read", takeover("", got.Instance.Incarnation), codes.AlreadyExists, "needs its secret", rev)
	refused(t, rn, "take-over with the stranger's own secret", takeover(theirs.Secret, ""), codes.AlreadyExists, "needs its secret", rev)
	refused(t, rn, "take-over with a malformed secret", takeover("letmein", ""), codes.InvalidArgument, "secret", rev)
	if err := takeover(secret.New(), ""); strings.Contains(err.Error(), own.Secret) {
		t.Fatal("AlreadyExists carries the owner's secret")
	}

	// Keep a lease alive that is not one's own.
	keepAlive := func(req *registryv1.KeepAliveRequest) (*registryv1.KeepAliveResponse, error) {
		sctx, cancel := context.WithCancel(ctx)
		defer cancel()
		ka, err := api.KeepAlive(sctx)
		if err != nil {
			t.Fatal(err)
		}
		if err := ka.Send(req); err != nil {
			t.Fatal(err)
		}
		return ka.Recv()
	}
	_, err = keepAlive(&registryv1.KeepAliveRequest{LeaseId: own.LeaseId, Service: "orders", Id: "o-1"})
	refused(t, rn, "keepalive without the secret", err, codes.InvalidArgument, "secret", rev)
	_, err = keepAlive(&registryv1.KeepAliveRequest{LeaseId: own.LeaseId})
	refused(t, rn, "keepalive naming no registration", err, codes.InvalidArgument, "service", rev)
	_, err = keepAlive(&registryv1.KeepAliveRequest{LeaseId: own.LeaseId, Service: "orders", Id: "o-1", Secret: theirs.Secret})
	refused(t, rn, "keepalive of the owner's lease with another secret", err, codes.PermissionDenied, "secret is not this registration's", rev)
	_, err = keepAlive(&registryv1.KeepAliveRequest{LeaseId: int64(foreign.ID), Service: "orders", Id: "o-1", Secret: theirs.Secret})
	refused(t, rn, "keepalive of a foreign lease", err, codes.PermissionDenied, "secret is not this registration's", rev)
	for name, lease := range map[string]clientv3.LeaseID{"the election session": session, "a foreign lease": foreign.ID} {
		resp, err := keepAlive(&registryv1.KeepAliveRequest{LeaseId: int64(lease), Service: "orders", Id: "x-1", Secret: theirs.Secret})
		if err != nil || !resp.Lost || resp.TtlSeconds != 0 {
			t.Fatalf("keepalive of %s under the stranger's own registration: %v, %v; want lost", name, resp, err)
		}
	}
	if ttl, err := rn.Etcd.TimeToLive(ctx, foreign.ID); err != nil || ttl.TTL > 58 {
		t.Fatalf("the foreign lease was renewed: %v, %v", ttl, err)
	}
	if n := testutil.ToFloat64(rn.Node.Metrics().NotOwner.WithLabelValues("KeepAlive")); n != 3 {
		t.Fatalf("registry_not_owner_total{method=KeepAlive} = %v, want 3 (no secret, two foreign)", n)
	}

	// The owner still can: renew, replace its own live record, end.
	resp, err := keepAlive(&registryv1.KeepAliveRequest{LeaseId: own.LeaseId, Service: "orders", Id: "o-1", Secret: own.Secret})
	if err != nil || resp.Lost || resp.TtlSeconds <= 0 {
		t.Fatalf("the owner's keepalive: %v, %v", resp, err)
	}
	again, err := api.Register(ctx, &registryv1.RegisterRequest{Instance: inst("orders", "o-1"), Ttl: durationpb.New(time.Minute), Secret: own.Secret})
	if err != nil || again.Secret != own.Secret || again.LeaseId == own.LeaseId {
		t.Fatalf("the owner replacing its live record: %v, %v", again, err)
	}
	if leaseAlive(t, rn.Etcd, clientv3.LeaseID(own.LeaseId)) {
		t.Fatal("the replaced registration's lease is still alive")
	}
	dr, err = api.Deregister(ctx, &registryv1.DeregisterRequest{Service: "orders", Id: "o-1", LeaseId: again.LeaseId, Secret: own.Secret})
	if err != nil || !dr.Deleted {
		t.Fatalf("the owner's deregister: %v, %v", dr, err)
	}
	if leaseAlive(t, rn.Etcd, clientv3.LeaseID(again.LeaseId)) || !leaseAlive(t, rn.Etcd, session) {
		t.Fatal("the owner's deregister left its lease alive, or took the election session")
	}
}

// An operator's Deregister (no secret) from this host deletes the record
// and revokes its lease, and only its lease: never one the caller names.
func TestOperatorDeregisterRevokesOnlyTheRecordsLease(t *testing.T) {
	rn := regnodetest.Start(t)
	api := newClient(t, rn.Addr).API()
	ctx := context.Background()
	session := electionLease(t, rn)
	reg, err := api.Register(ctx, &registryv1.RegisterRequest{Instance: inst("orders", "o-1"), Ttl: durationpb.New(time.Minute)})
	if err != nil {
		t.Fatal(err)
	}
	rev := headRev(t, rn.Etcd)
	dr, err := api.Deregister(ctx, &registryv1.DeregisterRequest{Service: "orders", Id: "o-1", LeaseId: int64(session)})
	if err != nil || dr.Deleted || headRev(t, rn.Etcd) != rev || !leaseAlive(t, rn.Etcd, session) {
		t.Fatalf("operator deregister naming the election session: %v, %v; the session alive: %v", dr, err, leaseAlive(t, rn.Etcd, session))
	}
	dr, err = api.Deregister(ctx, &registryv1.DeregisterRequest{Service: "orders", Id: "o-1"})
	if err != nil || !dr.Deleted {
		t.Fatalf("operator deregister: %v, %v", dr, err)
	}
	if leaseAlive(t, rn.Etcd, clientv3.LeaseID(reg.LeaseId)) || !leaseAlive(t, rn.Etcd, session) {
		t.Fatal("operator deregister left the record's lease, or took the session")
	}
}

// dialFrom is a raw API client whose connections come from local IP
// (127.0.0.x: another peer of the same host, as the limits see it).
func dialFrom(t *testing.T, addr, local string) registryv1.RegistryClient {
	t.Helper()
	d := net.Dialer{LocalAddr: &net.TCPAddr{IP: net.ParseIP(local)}}
	cc, err := grpc.NewClient("passthrough:///"+addr, grpc.WithTransportCredentials(insecure.NewCredentials()),
		grpc.WithContextDialer(func(ctx context.Context, a string) (net.Conn, error) { return d.DialContext(ctx, "tcp", a) }))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { cc.Close() })
	return registryv1.NewRegistryClient(cc)
}

// A flood of 1,000 Registers from one peer is limited past its burst:
// every refusal is ResourceExhausted naming the limit with a retry hint,
// is counted, and wrote nothing (etcd holds exactly the accepted ones,
// their saved states and leases). Another peer is not starved by it.
func TestRegisterFloodIsLimited(t *testing.T) {
	const flood, burst = 1000, 50
	m := etcdtest.Start(t, false)
	limits := peerlimit.DefaultConfig()
	limits.WriteRate, limits.WriteBurst = 1, burst
	rn := regnodetest.StartWith(t, node.Config{EtcdEndpoints: []string{m.ClientURL}, Limits: limits}, m.ClientURL)
	api := dialFrom(t, rn.Addr, "127.0.0.1")
	ctx := context.Background()

	var (
		mu       sync.Mutex
		ok       int
		limited  int
		problems []string
	)
	work := make(chan int)
	var wg sync.WaitGroup
	for range 16 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for i := range work {
				_, err := api.Register(ctx, &registryv1.RegisterRequest{Instance: inst("flood", "f-"+strconv.Itoa(i)), Ttl: durationpb.New(time.Minute)})
				mu.Lock()
				switch st := status.Convert(err); {
				case err == nil:
					ok++
				case st.Code() == codes.ResourceExhausted && strings.Contains(st.Message(), peerlimit.WriteRate) && hasRetryInfo(st):
					limited++
				default:
					problems = append(problems, err.Error())
				}
				mu.Unlock()
			}
		}()
	}
	for i := range flood {
		work <- i
	}
	close(work)
	wg.Wait()
	if len(problems) > 0 {
		t.Fatalf("%d registrations failed otherwise, first: %s", len(problems), problems[0])
	}
	// The burst, plus what the 1/s rate refilled while the flood ran.
	if ok < burst || limited == 0 || ok+limited != flood {
		t.Fatalf("%d accepted and %d limited of %d, want at least the burst %d accepted and the rest limited", ok, limited, flood, burst)
	}
	t.Logf("flood of %d from one peer: %d accepted, %d refused", flood, ok, limited)
	for _, prefix := range []string{rn.Prefix + "instances/flood/", rn.Prefix + "state/flood/"} {
		resp, err := rn.Etcd.Get(ctx, prefix, clientv3.WithPrefix(), clientv3.WithCountOnly())
		if err != nil || resp.Count != int64(ok) {
			t.Fatalf("etcd holds %d keys under %s (%v), want the %d accepted", resp.Count, prefix, err, ok)
		}
	}
	// The accepted registrations' leases, the prober's election session,
	// the regnode's announcement (internal/node/peers.go) and the leases the
	// registration pool holds ready (it refills as registrations take
	// them: read between two equal counts of it).
	var leases *clientv3.LeaseLeasesResponse
	waitFor(t, 30*time.Second, "the leases to be the accepted ones, the session, the announcement and the pool's", func() bool {
		idle := rn.Node.IdleLeases()
		var err error
		if leases, err = rn.Etcd.Leases(ctx); err != nil {
			t.Fatal(err)
		}
		return idle == rn.Node.IdleLeases() && len(leases.Leases) == ok+2+idle
	})
	if n := testutil.ToFloat64(rn.Node.Metrics().Limited.WithLabelValues(peerlimit.WriteRate)); int(n) != limited {
		t.Fatalf("registry_limited_total{limit=write_rate} = %v, want %d", n, limited)
	}
	// The flooding peer is still refused; another peer has its own bucket.
	if _, err := api.Register(ctx, &registryv1.RegisterRequest{Instance: inst("flood", "late")}); status.Code(err) != codes.ResourceExhausted {
		t.Fatalf("the flooding peer after its flood: %v", err)
	}
	other := dialFrom(t, rn.Addr, "127.0.0.2")
	if _, err := other.Register(ctx, &registryv1.RegisterRequest{Instance: inst("other", "o-1")}); err != nil {
		t.Fatalf("another peer during the flood: %v", err)
	}
}

func hasRetryInfo(st *status.Status) bool {
	for _, d := range st.Details() {
		if ri, ok := d.(*errdetails.RetryInfo); ok && ri.GetRetryDelay().AsDuration() > 0 {
			return true
		}
	}
	return false
}

// Streams are capped per peer: past the cap a Watch or KeepAlive is
// ResourceExhausted naming the limit; closing one frees its slot.
func TestStreamsCappedPerPeer(t *testing.T) {
	m := etcdtest.Start(t, false)
	limits := peerlimit.DefaultConfig()
	limits.MaxStreams = 2
	rn := regnodetest.StartWith(t, node.Config{EtcdEndpoints: []string{m.ClientURL}, Limits: limits}, m.ClientURL)
	api := dialFrom(t, rn.Addr, "127.0.0.1")
	ctx := context.Background()
	open := func() (context.CancelFunc, error) {
		sctx, cancel := context.WithCancel(ctx)
		w, err := api.Watch(sctx, &registryv1.WatchRequest{})
		if err == nil {
			_, err = w.Recv()
		}
		if err != nil {
			cancel()
		}
		return cancel, err
	}
	first, err := open()
	if err != nil {
		t.Fatal(err)
	}
	second, err := open()
	if err != nil {
		t.Fatal(err)
	}
	defer second()
	if _, err := open(); status.Code(err) != codes.ResourceExhausted || !strings.Contains(err.Error(), peerlimit.Streams) {
		t.Fatalf("a third Watch of a peer capped at 2: %v", err)
	}
	ka, err := api.KeepAlive(ctx)
	if err == nil {
		_, err = ka.Recv()
	}
	if status.Code(err) != codes.ResourceExhausted {
		t.Fatalf("a KeepAlive stream past the cap: %v", err)
	}
	if _, err := dialFrom(t, rn.Addr, "127.0.0.2").Watch(ctx, &registryv1.WatchRequest{}); err != nil {
		t.Fatalf("another peer's Watch: %v", err)
	}
	first()
	waitFor(t, 10*time.Second, "the closed stream's slot", func() bool {
		cancel, err := open()
		if err == nil {
			cancel()
		}
		return err == nil
	})
	if n := testutil.ToFloat64(rn.Node.Metrics().Limited.WithLabelValues(peerlimit.Streams)); n < 2 {
		t.Fatalf("registry_limited_total{limit=streams} = %v, want at least the 2 refusals", n)
	}
}

// syncBuffer is a bytes.Buffer a logger may write to from many goroutines.
type syncBuffer struct {
	mu sync.Mutex
	b  bytes.Buffer
}

func (s *syncBuffer) Write(p []byte) (int, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.b.Write(p)
}

func (s *syncBuffer) String() string {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.b.String()
}

// Every write is one structured audit line at info: the peer, the
// method, the instance key and the result, refusals included; no line
// carries a secret.
func TestWritesAreAudited(t *testing.T) {
	m := etcdtest.Start(t, false)
	var logs syncBuffer
	rn := regnodetest.StartWith(t, node.Config{EtcdEndpoints: []string{m.ClientURL}, OperatorDeregister: "none",
		Logger: slog.New(slog.NewJSONHandler(&logs, &slog.HandlerOptions{Level: slog.LevelInfo}))}, m.ClientURL)
	api := newClient(t, rn.Addr).API()
	ctx := context.Background()
	reg, err := api.Register(ctx, &registryv1.RegisterRequest{Instance: inst("orders", "o-1")})
	if err != nil {
		t.Fatal(err)
	}
	if _, err := api.Drain(ctx, &registryv1.DrainRequest{Service: "orders", Id: "o-1", Reason: "rack 7"}); err != nil {
		t.Fatal(err)
	}
	if _, err := api.Undrain(ctx, &registryv1.UndrainRequest{Service: "orders", Id: "o-1"}); err != nil {
		t.Fatal(err)
	}
	if _, err := api.Deregister(ctx, &registryv1.DeregisterRequest{Service: "orders", Id: "o-1"}); status.Code(err) != codes.PermissionDenied {
		t.Fatalf("operator deregister with operators off: %v", err)
	}
	if _, err := api.Register(ctx, &registryv1.RegisterRequest{Instance: inst("orders", "o-1"), Secret: secret.New()}); status.Code(err) != codes.AlreadyExists {
		t.Fatalf("take-over: %v", err)
	}
	if _, err := api.Deregister(ctx, &registryv1.DeregisterRequest{Service: "orders", Id: "o-1", Secret: reg.Secret}); err != nil {
		t.Fatal(err)
	}
	want := []struct{ method, result string }{
		{"Register", "OK"}, {"Drain", "OK"}, {"Undrain", "OK"}, {"Deregister", "PermissionDenied"},
		{"Register", "AlreadyExists"}, {"Deregister", "OK"},
	}
	var got []map[string]any
	for _, line := range strings.Split(strings.TrimSpace(logs.String()), "\n") {
		if strings.Contains(line, reg.Secret) {
			t.Fatalf("a log line carries the secret: %s", line)
		}
		var rec map[string]any
		if err := json.Unmarshal([]byte(line), &rec); err != nil {
			t.Fatalf("log line %q: %v", line, err)
		}
		if rec["msg"] == "audit" {
			got = append(got, rec)
		}
	}
	if len(got) != len(want) {
		t.Fatalf("%d audit lines, want %d:\n%s", len(got), len(want), logs.String())
	}
	for i, w := range want {
		g := got[i]
		result := "ok"
		if w.result != "OK" {
			result = w.result
		}
		if g["level"] != "INFO" || g["method"] != w.method || g["result"] != result || g["key"] != "orders/o-1" || g["peer"] != "127.0.0.1" {
			t.Errorf("audit line %d = %v, want %s of orders/o-1 from 127.0.0.1: %s", i, g, w.method, result)
		}
	}
	if got[1]["reason"] != "rack 7" {
		t.Errorf("the drain's audit line has no reason: %v", got[1])
	}
}

// The SDK proves ownership by itself: on a regnode that allows no
// operator deregister, its renewals land (none refused) and its Close
// deletes the record and revokes its lease, all with the secret it keeps.
func TestSDKUsesItsSecret(t *testing.T) {
	m := etcdtest.Start(t, false)
	rn := regnodetest.StartWith(t, node.Config{EtcdEndpoints: []string{m.ClientURL}, OperatorDeregister: "none"}, m.ClientURL)
	c := newClient(t, rn.Addr)
	ctx := context.Background()
	reg, err := c.Register(ctx, inst("orders", "o-1"), client.RegisterOptions{TTL: 3 * time.Second, DrainGrace: time.Millisecond})
	if err != nil {
		t.Fatal(err)
	}
	metrics := rn.Node.Metrics()
	waitFor(t, 20*time.Second, "two renewals", func() bool { return testutil.ToFloat64(metrics.KeepAlives) >= 2 })
	if n := testutil.ToFloat64(metrics.NotOwner.WithLabelValues("KeepAlive")); n != 0 {
		t.Fatalf("%v of the SDK's renewals were refused", n)
	}
	lease := reg.Status().LeaseID
	if err := reg.Close(ctx); err != nil {
		t.Fatalf("close: %v", err)
	}
	resp, err := rn.Etcd.Get(ctx, rn.Prefix+"instances/orders/o-1")
	if err != nil || len(resp.Kvs) != 0 || leaseAlive(t, rn.Etcd, clientv3.LeaseID(lease)) {
		t.Fatalf("after Close: record %v (%v), lease alive %v", resp.Kvs, err, leaseAlive(t, rn.Etcd, clientv3.LeaseID(lease)))
	}
}

// The default operator policy: a caller on this host may deregister
// without the secret, any other may not.
func TestLoopbackOperator(t *testing.T) {
	at := func(ip string) context.Context {
		return peer.NewContext(context.Background(), &peer.Peer{Addr: &net.TCPAddr{IP: net.ParseIP(ip), Port: 40000}})
	}
	if err := server.LoopbackOperator(at("127.0.0.1")); err != nil {
		t.Fatalf("loopback peer refused: %v", err)
	}
	if err := server.LoopbackOperator(at("192.0.2.7")); err == nil {
		t.Fatal("a remote peer may deregister without the secret")
	}
	if err := server.NoOperator(at("127.0.0.1")); err == nil {
		t.Fatal("NoOperator allows a loopback peer")
	}
}

// Renewals have a bucket of their own per peer: past it a KeepAlive
// stream ends with ResourceExhausted naming keepalive_rate.
func TestKeepAliveRateLimited(t *testing.T) {
	m := etcdtest.Start(t, false)
	limits := peerlimit.DefaultConfig()
	limits.KeepAliveRate, limits.KeepAliveBurst = 0.001, 2
	rn := regnodetest.StartWith(t, node.Config{EtcdEndpoints: []string{m.ClientURL}, Limits: limits}, m.ClientURL)
	api := dialFrom(t, rn.Addr, "127.0.0.1")
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	reg, err := api.Register(ctx, &registryv1.RegisterRequest{Instance: inst("orders", "o-1"), Ttl: durationpb.New(time.Minute)})
	if err != nil {
		t.Fatal(err)
	}
	ka, err := api.KeepAlive(ctx)
	if err != nil {
		t.Fatal(err)
	}
	req := &registryv1.KeepAliveRequest{LeaseId: reg.LeaseId, Service: "orders", Id: "o-1", Secret: reg.Secret}
	for i := range 3 {
		if err := ka.Send(req); err != nil {
			t.Fatal(err)
		}
		_, err := ka.Recv()
		if i < 2 && err != nil {
			t.Fatalf("renewal %d within the burst: %v", i, err)
		}
		if i == 2 && (status.Code(err) != codes.ResourceExhausted || !strings.Contains(err.Error(), peerlimit.KeepAliveRate) || !hasRetryInfo(status.Convert(err))) {
			t.Fatalf("renewal past the burst: %v", err)
		}
	}
	if n := testutil.ToFloat64(rn.Node.Metrics().Limited.WithLabelValues(peerlimit.KeepAliveRate)); n != 1 {
		t.Fatalf("registry_limited_total{limit=keepalive_rate} = %v, want 1", n)
	}
}
