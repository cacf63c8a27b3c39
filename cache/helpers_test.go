package cache

import (
	"fmt"
	"strings"
	"testing"

	registryv1 "github.com/regcluster/registry/proto/registry/v1"
)

// in returns an instance service/id at address addr with mod revision rev.
func in(service, id, addr string, rev int64) *registryv1.Instance {
	return &registryv1.Instance{Service: service, Id: id, Address: addr, Weight: 100, ModRevision: rev}
}

func put(inst *registryv1.Instance) Event {
	return Event{Type: Put, Service: inst.Service, ID: inst.Id, Instance: inst}
}

func del(service, id string) Event { return Event{Type: Delete, Service: service, ID: id} }

// diffString summarizes d as "rev=R [reset] +s/i ~s/i@addr -s/i", in the
// order of its lists.
func diffString(d Diff) string {
	var b strings.Builder
	fmt.Fprintf(&b, "rev=%d", d.Revision)
	if d.Reset {
		b.WriteString(" reset")
	}
	for _, in := range d.Added {
		fmt.Fprintf(&b, " +%s/%s@%s", in.Service, in.Id, in.Address)
	}
	for _, in := range d.Updated {
		fmt.Fprintf(&b, " ~%s/%s@%s", in.Service, in.Id, in.Address)
	}
	for _, k := range d.Removed {
		fmt.Fprintf(&b, " -%s/%s", k.Service, k.ID)
	}
	return b.String()
}

// viewString summarizes s as "rev=R s/i@addr ...", in All's order, and
// checks that Services, Instances, Get and Len agree with All.
func viewString(t testing.TB, s *Snapshot) string {
	t.Helper()
	var b strings.Builder
	fmt.Fprintf(&b, "rev=%d", s.Revision())
	all := s.All()
	n := 0
	for _, svc := range s.Services() {
		list := s.Instances(svc)
		if len(list) == 0 {
			t.Errorf("service %q listed with no instances", svc)
		}
		for i, inst := range list {
			if n >= len(all) || inst != all[n] {
				t.Errorf("Instances(%q)[%d] is not All()[%d]", svc, i, n)
			}
			if got, ok := s.Get(svc, inst.Id); !ok || got != inst {
				t.Errorf("Get(%q, %q) = %v, %v; want the listed instance", svc, inst.Id, got, ok)
			}
			n++
		}
	}
	if n != len(all) || n != s.Len() {
		t.Errorf("Services/Instances hold %d instances, All %d, Len %d", n, len(all), s.Len())
	}
	for _, inst := range all {
		fmt.Fprintf(&b, " %s/%s@%s", inst.Service, inst.Id, inst.Address)
	}
	return b.String()
}
