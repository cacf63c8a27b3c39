package main_test

import (
	"context"
	"fmt"
	"syscall"
	"testing"
	"time"

	"github.com/miekg/dns"
	"google.golang.org/protobuf/types/known/durationpb"

	"github.com/regcluster/registry/internal/etcdtest"
	registryv1 "github.com/regcluster/registry/proto/registry/v1"
)

// REGNODE_DNS_LISTEN and REGNODE_DNS_TTL turn DNS on: the start-up line
// says where, a registered instance is answered with that TTL, and
// SIGTERM still stops the regnode cleanly.
func TestDNSFromEnv(t *testing.T) {
	env := embeddedEnv(t, t.TempDir())
	dnsAddr := fmt.Sprintf("127.0.0.1:%d", etcdtest.FreePort(t))
	env["REGNODE_DNS_LISTEN"], env["REGNODE_DNS_TTL"] = dnsAddr, "9s"
	p := start(t, env)
	cc := dial(t, env["REGNODE_LISTEN"])
	waitServing(t, cc, p)
	p.waitStderr(t, "DNS on "+dnsAddr)
	if _, err := registryv1.NewRegistryClient(cc).Register(context.Background(), &registryv1.RegisterRequest{
		Instance: &registryv1.Instance{Service: "orders", Id: "o-1", Address: "10.0.0.1:80"},
		Ttl:      durationpb.New(time.Minute)}); err != nil {
		t.Fatal(err)
	}
	c := &dns.Client{Timeout: 2 * time.Second}
	deadline := time.Now().Add(30 * time.Second)
	for {
		m, _, err := c.Exchange(new(dns.Msg).SetQuestion("orders.service.registry.", dns.TypeA), dnsAddr)
		if err == nil && len(m.Answer) == 1 {
			if a, ok := m.Answer[0].(*dns.A); !ok || a.A.String() != "10.0.0.1" || a.Hdr.Ttl != 9 {
				t.Fatalf("answer %v, want 10.0.0.1 with TTL 9", m.Answer[0])
			}
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("no answer from DNS after 30s: %v, %v; stderr:\n%s", m, err, p.stderr)
		}
		time.Sleep(50 * time.Millisecond)
	}
	if err := p.cmd.Process.Signal(syscall.SIGTERM); err != nil {
		t.Fatal(err)
	}
	if code := p.wait(t, 20*time.Second); code != 0 {
		t.Fatalf("exit %d after SIGTERM; stderr:\n%s", code, p.stderr)
	}
}
