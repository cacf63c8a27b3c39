package main

import (
	"context"
	"fmt"
	"hash/fnv"
	"math/rand/v2"
	"sync"
	"sync/atomic"
	"time"

	clientv3 "go.etcd.io/etcd/client/v3"
	"go.etcd.io/etcd/client/v3/naming/endpoints"
	"google.golang.org/grpc/resolver"
	"google.golang.org/grpc/serviceconfig"
	"google.golang.org/protobuf/proto"
	"google.golang.org/protobuf/types/known/timestamppb"

	registryv1 "github.com/regcluster/registry/proto/registry/v1"
	"github.com/regcluster/registry/record"
)

// A plan is a fixed sequence of changes to one service's instances: health
// transitions, drains and undrains, additions and deletions, in turn. The
// same plan is written into every namespace a scenario compares (our
// registry prefix; a prefix that direct etcd watchers follow; an etcd
// naming target), so every consumer sees the same changes.
type plan struct {
	service string
	initial []*registryv1.Instance
	ops     []planOp
	// fps maps the fingerprint of an endpoint set (naming) to the index of
	// the last op it reflects (-1: the initial set). Every prefix of the
	// plan gives a different set (ids are never reused and deletions take
	// the oldest instance), so a set names its prefix exactly.
	fps map[uint64]int64
}

type planOp struct {
	kind string // health, drain, add, delete
	id   string
	inst *registryv1.Instance // the new record (nil for delete)
	val  []byte               // record.Encode(inst)
}

// makePlan returns initial instances and n changes.
func makePlan(service string, initial, n int, seed uint64) (*plan, error) {
	rng := rand.New(rand.NewPCG(seed, 42))
	p := &plan{service: service, fps: map[uint64]int64{}}
	var pop []string // oldest first
	cur := map[string]*registryv1.Instance{}
	next := 0
	t0 := time.Date(2025, 1, 1, 0, 0, 0, 0, time.UTC)
	newInst := func() *registryv1.Instance {
		next++
		id := fmt.Sprintf("i%d", next)
		return &registryv1.Instance{Service: service, Id: id,
			Address:   fmt.Sprintf("10.%d.%d.%d:8080", next/65536%256, next/256%256, next%256),
			Zone:      fmt.Sprintf("z%d", next%3),
			Lifecycle: registryv1.Lifecycle_LIFECYCLE_SERVING,
			Health:    &registryv1.Health{State: registryv1.HealthState_HEALTH_STATE_HEALTHY, Since: timestamppb.New(t0)},
		}
	}
	for range max(initial, 2) {
		in := newInst()
		p.initial = append(p.initial, in)
		pop = append(pop, in.Id)
		cur[in.Id] = in
	}
	set := map[string]string{} // id → endpoint address
	for _, in := range p.initial {
		set[in.Id] = endpointAddr(in.Id, -1)
	}
	p.fps[fingerprint(set)] = -1
	for i := range n {
		var op planOp
		kind := []string{"health", "drain", "add", "delete"}[i%4]
		if len(pop) < 2 && kind == "delete" {
			kind = "add"
		}
		switch kind {
		case "health", "drain":
			id := pop[rng.IntN(len(pop))]
			in := proto.CloneOf(cur[id])
			if kind == "health" {
				st := registryv1.HealthState_HEALTH_STATE_DEGRADED
				if in.GetHealth().GetState() == st {
					st = registryv1.HealthState_HEALTH_STATE_HEALTHY
				}
				in.Health = &registryv1.Health{State: st, Since: timestamppb.New(t0.Add(time.Duration(i) * time.Second)),
					Reason: "bench", Observer: "regbench"}
			} else {
				lc := registryv1.Lifecycle_LIFECYCLE_DRAINING
				if in.Lifecycle == lc {
					lc = registryv1.Lifecycle_LIFECYCLE_SERVING
				}
				in.Lifecycle, in.LifecycleReason = lc, "bench"
			}
			in.Version = fmt.Sprintf("w%d", i)
			cur[id] = in
			op = planOp{kind: kind, id: id, inst: in}
			set[id] = endpointAddr(id, i)
		case "add":
			in := newInst()
			in.Version = fmt.Sprintf("w%d", i)
			pop = append(pop, in.Id)
			cur[in.Id] = in
			op = planOp{kind: kind, id: in.Id, inst: in}
			set[in.Id] = endpointAddr(in.Id, i)
		case "delete":
			id := pop[0]
			pop = pop[1:]
			delete(cur, id)
			op = planOp{kind: kind, id: id}
			delete(set, id)
		}
		if op.inst != nil {
			v, err := record.Encode(op.inst)
			if err != nil {
				return nil, err
			}
			op.val = v
		}
		p.ops = append(p.ops, op)
		p.fps[fingerprint(set)] = int64(i)
	}
	return p, nil
}

// endpointAddr is the address an op gives an instance's endpoint in the
// naming namespace: unique per op, so a resolver's address list tells
// which ops it reflects.
func endpointAddr(id string, op int) string { return fmt.Sprintf("%s-w%d:80", id, op) }

func addrHash(a string) uint64 {
	h := fnv.New64a()
	h.Write([]byte(a))
	return h.Sum64()
}

// fingerprint is an order-independent hash of a set of addresses.
func fingerprint(set map[string]string) uint64 {
	var s uint64
	for _, a := range set {
		s += addrHash(a)
	}
	return s
}

// namespaces of one service: ours (the registry prefix regnode follows),
// xds (the same records in the registry under another service name,
// xdsService(service), which xDS streams follow, so that neither they nor
// ours carry the other's changes), direct (the same layout and records
// under another prefix, followed by plain etcd watchers), naming (an etcd
// naming target for endpoints.Manager and etcd's gRPC resolver).
type namespaces struct {
	ours, direct record.Keys
	target       string
	em           endpoints.Manager
}

const directPrefix = "/regbench/direct/"

// xdsService is the registry service whose records copy service's for the
// xDS streams.
func xdsService(service string) string { return service + "-x" }

// asXDS is in with the xds namespace's service name, encoded.
func asXDS(in *registryv1.Instance) ([]byte, error) {
	c := proto.Clone(in).(*registryv1.Instance)
	c.Service = xdsService(in.Service)
	return record.Encode(c)
}

func newNamespaces(cli *clientv3.Client, service string) (*namespaces, error) {
	target := "regbench/naming/" + service
	em, err := endpoints.NewManager(cli, target)
	if err != nil {
		return nil, err
	}
	return &namespaces{ours: record.NewKeys(""), direct: record.NewKeys(directPrefix), target: target, em: em}, nil
}

// writeInitial puts the plan's initial instances into every namespace.
func (ns *namespaces) writeInitial(ctx context.Context, cli *clientv3.Client, p *plan) error {
	for _, in := range p.initial {
		v, err := record.Encode(in)
		if err != nil {
			return err
		}
		if _, err := cli.Put(ctx, ns.ours.Instance(in.Service, in.Id), string(v)); err != nil {
			return err
		}
		if _, err := cli.Put(ctx, ns.direct.Instance(in.Service, in.Id), string(v)); err != nil {
			return err
		}
		xv, err := asXDS(in)
		if err != nil {
			return err
		}
		if _, err := cli.Put(ctx, ns.ours.Instance(xdsService(in.Service), in.Id), string(xv)); err != nil {
			return err
		}
		if err := ns.em.AddEndpoint(ctx, ns.target+"/"+in.Id, endpoints.Endpoint{Addr: endpointAddr(in.Id, -1)}); err != nil {
			return err
		}
	}
	return nil
}

// apply writes op i of the plan into one namespace and returns the commit:
// keyed by etcd revision for the record namespaces, by op index for the
// naming one (endpoints.Manager does not return the revision; the
// resolver's address list names the op instead).
func (ns *namespaces) apply(ctx context.Context, cli *clientv3.Client, which string, p *plan, i int) (commit, error) {
	op := p.ops[i]
	switch which {
	case "naming":
		key := ns.target + "/" + op.id
		var err error
		if op.inst == nil {
			err = ns.em.DeleteEndpoint(ctx, key)
		} else {
			err = ns.em.AddEndpoint(ctx, key, endpoints.Endpoint{Addr: endpointAddr(op.id, i),
				Metadata: map[string]string{"health": op.inst.GetHealth().GetState().String(), "lifecycle": op.inst.Lifecycle.String()}})
		}
		return commit{key: int64(i), at: time.Now()}, err
	default:
		keys, service, val := ns.ours, p.service, op.val
		switch which {
		case "direct":
			keys = ns.direct
		case "xds":
			service = xdsService(p.service)
			if op.inst != nil {
				var err error
				if val, err = asXDS(op.inst); err != nil {
					return commit{}, err
				}
			}
		}
		key := keys.Instance(service, op.id)
		var rev int64
		if op.inst == nil {
			resp, err := cli.Delete(ctx, key)
			if err != nil {
				return commit{}, err
			}
			rev = resp.Header.Revision
		} else {
			resp, err := cli.Put(ctx, key, string(val))
			if err != nil {
				return commit{}, err
			}
			rev = resp.Header.Revision
		}
		return commit{key: rev, at: time.Now()}, nil
	}
}

// cleanup deletes the service from every namespace.
func (ns *namespaces) cleanup(ctx context.Context, cli *clientv3.Client, service string) {
	ctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), 10*time.Second)
	defer cancel()
	_, _ = cli.Delete(ctx, ns.ours.Service(service), clientv3.WithPrefix())
	_, _ = cli.Delete(ctx, ns.ours.Service(xdsService(service)), clientv3.WithPrefix())
	_, _ = cli.Delete(ctx, ns.direct.Service(service), clientv3.WithPrefix())
	_, _ = cli.Delete(ctx, ns.target+"/", clientv3.WithPrefix())
}

// recordingCC is the resolver.ClientConn handed to etcd's naming resolver:
// it stands where grpc-go's ClientConn would and records every address
// list the resolver pushes (the balancer is left out: we measure the
// resolver, as for ours we measure the subscription).
type recordingCC struct {
	obs       *observer
	fps       map[uint64]int64
	unmatched atomic.Int64
	updates   atomic.Int64

	mu    sync.Mutex
	addrs map[string]bool
}

func (c *recordingCC) UpdateState(s resolver.State) error {
	now := time.Now()
	var fp uint64
	set := make(map[string]bool, len(s.Endpoints))
	for _, ep := range s.Endpoints {
		for _, a := range ep.Addresses {
			fp += addrHash(a.Addr)
			set[a.Addr] = true
		}
	}
	c.updates.Add(1)
	if c.fps != nil {
		if i, ok := c.fps[fp]; ok {
			c.obs.saw(i, now)
		} else {
			c.unmatched.Add(1)
		}
	}
	c.mu.Lock()
	c.addrs = set
	c.mu.Unlock()
	return nil
}

func (c *recordingCC) current() map[string]bool {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.addrs
}

func (c *recordingCC) ReportError(error)                   {}
func (c *recordingCC) NewAddress(addrs []resolver.Address) {}
func (c *recordingCC) ParseServiceConfig(string) *serviceconfig.ParseResult {
	return &serviceconfig.ParseResult{}
}
