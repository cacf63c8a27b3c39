package dnsapi_test

import (
	"context"
	"fmt"
	"io"
	"net"
	"net/http"
	"os"
	"os/exec"
	"regexp"
	"slices"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/miekg/dns"
	"go.uber.org/goleak"
	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials/insecure"
	"google.golang.org/protobuf/types/known/durationpb"

	"github.com/regcluster/registry/dnsapi"
	"github.com/regcluster/registry/internal/etcdtest"
	"github.com/regcluster/registry/internal/node"
	"github.com/regcluster/registry/internal/regnodetest"
	registryv1 "github.com/regcluster/registry/proto/registry/v1"
)

func TestMain(m *testing.M) {
	goleak.VerifyTestMain(m, etcdtest.LeakOptions()...)
}

// regnode is a real regnode on a real etcd, serving DNS on 127.0.0.1.
type regnode struct {
	*regnodetest.Regnode
	dns string // host:port, UDP and TCP
	reg registryv1.RegistryClient
}

// startRegnode runs a regnode whose DNS config is dnsapi's defaults
// changed by set, on 127.0.0.1 port 0.
func startRegnode(t *testing.T, set func(*dnsapi.Config)) *regnode {
	t.Helper()
	e := etcdtest.Start(t, false)
	cfg := node.Config{EtcdEndpoints: []string{e.ClientURL}, DNS: dnsapi.DefaultConfig()}
	cfg.DNS.Listen = "127.0.0.1:0"
	if set != nil {
		set(&cfg.DNS)
	}
	rn := regnodetest.StartWith(t, cfg, e.ClientURL)
	cc, err := grpc.NewClient(rn.Addr, grpc.WithTransportCredentials(insecure.NewCredentials()))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { cc.Close() })
	addr := rn.Node.DNSAddr()
	if addr == "" {
		t.Fatal("the regnode serves no DNS")
	}
	return &regnode{Regnode: rn, dns: addr, reg: registryv1.NewRegistryClient(cc)}
}

// register registers inst for an hour and waits until the regnode's view
// holds it.
func (r *regnode) register(t testing.TB, inst *registryv1.Instance) {
	t.Helper()
	resp, err := r.reg.Register(context.Background(), &registryv1.RegisterRequest{Instance: inst, Ttl: durationpb.New(time.Hour)})
	if err != nil {
		t.Fatalf("register %s/%s: %v", inst.Service, inst.Id, err)
	}
	r.WaitRevision(t, resp.Revision)
}

// exchange sends q over network ("udp", "tcp") and returns the reply.
func (r *regnode) exchange(t testing.TB, network string, q *dns.Msg) *dns.Msg {
	t.Helper()
	c := &dns.Client{Net: network, Timeout: 5 * time.Second, UDPSize: 65535}
	m, _, err := c.Exchange(q, r.dns)
	if err != nil {
		t.Fatalf("%s query %v: %v", network, q.Question, err)
	}
	return m
}

// ask is exchange of one question over TCP.
func (r *regnode) ask(t testing.TB, name string, qtype uint16) *dns.Msg {
	t.Helper()
	return r.exchange(t, "tcp", new(dns.Msg).SetQuestion(name, qtype))
}

// raw sends packet over UDP from a fresh socket and returns the reply's
// bytes, or nil if none came within wait.
func (r *regnode) raw(t testing.TB, packet []byte, wait time.Duration) []byte {
	t.Helper()
	c, err := net.Dial("udp", r.dns)
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	if _, err := c.Write(packet); err != nil {
		t.Fatal(err)
	}
	c.SetReadDeadline(time.Now().Add(wait))
	buf := make([]byte, 65536)
	n, err := c.Read(buf)
	if err != nil {
		return nil
	}
	return buf[:n]
}

// rawTCP sends packet over a fresh TCP connection and returns the
// reply's bytes (without the length prefix).
func (r *regnode) rawTCP(t testing.TB, packet []byte) []byte {
	t.Helper()
	c, err := net.Dial("tcp", r.dns)
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	c.SetDeadline(time.Now().Add(10 * time.Second))
	if _, err := c.Write(append([]byte{byte(len(packet) >> 8), byte(len(packet))}, packet...)); err != nil {
		t.Fatal(err)
	}
	var n [2]byte
	if _, err := io.ReadFull(c, n[:]); err != nil {
		t.Fatalf("TCP reply: %v", err)
	}
	b := make([]byte, int(n[0])<<8|int(n[1]))
	if _, err := io.ReadFull(c, b); err != nil {
		t.Fatalf("TCP reply: %v", err)
	}
	return b
}

// resolver is Go's own DNS client, sending every query to the regnode.
func (r *regnode) resolver() *net.Resolver {
	return &net.Resolver{PreferGo: true, Dial: func(ctx context.Context, network, _ string) (net.Conn, error) {
		var d net.Dialer
		return d.DialContext(ctx, network, r.dns)
	}}
}

// addresses is the sorted A and AAAA answer for name.
func (r *regnode) addresses(t testing.TB, name string) []string {
	t.Helper()
	var out []string
	for _, qt := range []uint16{dns.TypeA, dns.TypeAAAA} {
		m := r.ask(t, name, qt)
		if m.Rcode != dns.RcodeSuccess {
			t.Fatalf("%s %s: %s", name, dns.TypeToString[qt], dns.RcodeToString[m.Rcode])
		}
		for _, rr := range m.Answer {
			switch rr := rr.(type) {
			case *dns.A:
				out = append(out, rr.A.String())
			case *dns.AAAA:
				out = append(out, rr.AAAA.String())
			}
		}
	}
	slices.Sort(out)
	return out
}

// waitAddresses waits (a minute at most) until name's addresses are want.
func (r *regnode) waitAddresses(t testing.TB, name string, want ...string) {
	t.Helper()
	slices.Sort(want)
	deadline := time.Now().Add(time.Minute)
	for {
		got := r.addresses(t, name)
		if slices.Equal(got, want) {
			return
		}
		if time.Now().After(deadline) {
			t.Fatalf("%s: addresses %v after a minute, want %v", name, got, want)
		}
		time.Sleep(50 * time.Millisecond)
	}
}

// metric reads registry_dns_queries_total{result} from /metrics.
func (r *regnode) metric(t testing.TB, result string) int {
	t.Helper()
	resp, err := http.Get("http://" + r.Node.MetricsAddr() + "/metrics")
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	body, err := io.ReadAll(resp.Body)
	if err != nil {
		t.Fatal(err)
	}
	m := regexp.MustCompile(`(?m)^registry_dns_queries_total\{result="` + result + `"\} (\d+)$`).FindSubmatch(body)
	if m == nil {
		t.Fatalf("/metrics has no registry_dns_queries_total{result=%q}", result)
	}
	n, _ := strconv.Atoi(string(m[1]))
	return n
}

// dig runs dig against the regnode (one try, no retry over TCP unless
// args say) and returns its output. Without dig the test is skipped,
// unless REGISTRY_REQUIRE_DIG is set (CI sets it), when it fails.
func (r *regnode) dig(t testing.TB, args ...string) string {
	t.Helper()
	path, err := exec.LookPath("dig")
	if err != nil {
		if os.Getenv("REGISTRY_REQUIRE_DIG") != "" {
			t.Fatal("dig is not installed and REGISTRY_REQUIRE_DIG is set: apt-get install -y bind9-dnsutils")
		}
		t.Skip("skipping: dig is not installed (apt-get install -y bind9-dnsutils; set REGISTRY_REQUIRE_DIG=1 to make this a failure)")
	}
	host, port, _ := net.SplitHostPort(r.dns)
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	out, err := exec.CommandContext(ctx, path, append([]string{"@" + host, "-p", port, "+time=5", "+tries=1"}, args...)...).CombinedOutput()
	if err != nil {
		t.Fatalf("dig %s: %v\n%s", strings.Join(args, " "), err, out)
	}
	return string(out)
}

// digAnswers are the answer lines of dig's output: owner, TTL, type,
// data.
func digAnswers(out string) [][]string {
	var rows [][]string
	in := false
	for _, line := range strings.Split(out, "\n") {
		switch {
		case strings.HasPrefix(line, ";; ANSWER SECTION:"):
			in = true
		case in && strings.TrimSpace(line) == "":
			in = false
		case in:
			f := strings.Fields(line)
			if len(f) >= 5 {
				rows = append(rows, append([]string{f[0], f[1], f[3]}, strings.Join(f[4:], " ")))
			}
		}
	}
	return rows
}

// digHeader is what dig says of the reply: its status, its flags and its
// size in bytes.
func digHeader(t testing.TB, out string) (status string, flags []string, size int) {
	t.Helper()
	if m := regexp.MustCompile(`status: (\w+)`).FindStringSubmatch(out); m != nil {
		status = m[1]
	}
	if m := regexp.MustCompile(`;; flags: ([a-z ]+);`).FindStringSubmatch(out); m != nil {
		flags = strings.Fields(m[1])
	}
	m := regexp.MustCompile(`MSG SIZE\s+rcvd: (\d+)`).FindStringSubmatch(out)
	if m == nil || status == "" {
		t.Fatalf("dig's output has no status or size:\n%s", out)
	}
	size, _ = strconv.Atoi(m[1])
	return status, flags, size
}

func matches(s, expr string) bool { return regexp.MustCompile(expr).MatchString(s) }

func ip(i int) string { return fmt.Sprintf("10.%d.%d.%d", i/65536%256, i/256%256, i%256) }
