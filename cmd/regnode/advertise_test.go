package main_test

import (
	"context"
	"fmt"
	"testing"
	"time"

	clientv3 "go.etcd.io/etcd/client/v3"
	"google.golang.org/protobuf/types/known/durationpb"

	"github.com/regcluster/registry/internal/etcdtest"
	registryv1 "github.com/regcluster/registry/proto/registry/v1"
	"github.com/regcluster/registry/record"
)

// --advertise-address is what a regnode announces under <prefix>nodes/,
// and how the others reach it: b listens on 127.0.0.1:P and advertises
// localhost:P (another spelling of the same listener, the way a pod
// advertises its DNS name over its 0.0.0.0 listener); a's WaitApplied
// asks b there, and counts b's subscriber once; b's own WaitApplied knows
// the announcement for its own, and asks only a.
func TestAdvertiseAddressIsAnnouncedAndDialed(t *testing.T) {
	m := etcdtest.Start(t, false)
	port := etcdtest.FreePort(t)
	type regnode struct{ name, api, advertise string }
	rns := []regnode{
		{name: "a", api: fmt.Sprintf("127.0.0.1:%d", etcdtest.FreePort(t))},
		{name: "b", api: fmt.Sprintf("127.0.0.1:%d", port), advertise: fmt.Sprintf("localhost:%d", port)},
	}
	for _, r := range rns {
		env := map[string]string{"REGNODE_ETCD_ENDPOINTS": m.ClientURL, "REGNODE_NAME": r.name, "REGNODE_LISTEN": r.api,
			"REGNODE_METRICS_LISTEN": "off", "REGNODE_LOG_LEVEL": "warn"}
		if r.advertise != "" {
			env["REGNODE_ADVERTISE_ADDRESS"] = r.advertise
		}
		p := start(t, env)
		waitServing(t, dial(t, r.api), p)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()

	cli, err := clientv3.New(clientv3.Config{Endpoints: []string{m.ClientURL}, DialTimeout: 5 * time.Second, Logger: etcdtest.QuietLogger()})
	if err != nil {
		t.Fatal(err)
	}
	defer cli.Close()
	nodes := record.DefaultPrefix + "nodes/"
	got, err := cli.Get(ctx, nodes, clientv3.WithPrefix())
	if err != nil {
		t.Fatal(err)
	}
	announced := map[string]string{}
	for _, kv := range got.Kvs {
		announced[string(kv.Key)[len(nodes):]] = string(kv.Value)
	}
	if len(announced) != 2 || announced[rns[0].api] != "a" || announced[rns[1].advertise] != "b" {
		t.Fatalf("announcements %v, want a at %s and b at %s", announced, rns[0].api, rns[1].advertise)
	}

	a := registryv1.NewRegistryClient(dial(t, rns[0].api))
	b := registryv1.NewRegistryClient(dial(t, rns[1].api))
	if _, err := a.Register(ctx, &registryv1.RegisterRequest{Instance: &registryv1.Instance{Service: "orders", Id: "o-1", Address: "10.0.0.1:80"},
		Ttl: durationpb.New(time.Minute)}); err != nil {
		t.Fatal(err)
	}
	// One subscriber, on b, that acknowledges everything it gets.
	st, err := b.Subscribe(ctx)
	if err != nil {
		t.Fatal(err)
	}
	if err := st.Send(&registryv1.SubscribeRequest{Subscriber: "on-b",
		Kind: &registryv1.SubscribeRequest_Add{Add: &registryv1.SubscribeAdd{Service: "orders"}}}); err != nil {
		t.Fatal(err)
	}
	acked := make(chan error, 1)
	go func() {
		for {
			msg, err := st.Recv()
			if err != nil {
				acked <- err
				return
			}
			if err := st.Send(&registryv1.SubscribeRequest{Kind: &registryv1.SubscribeRequest_Ack{
				Ack: &registryv1.SubscribeAck{Service: "orders", Revision: msg.GetUnit().GetRevision()}}}); err != nil {
				acked <- err
				return
			}
		}
	}()
	d, err := a.Drain(ctx, &registryv1.DrainRequest{Service: "orders", Id: "o-1"})
	if err != nil {
		t.Fatal(err)
	}
	for _, via := range []struct {
		name string
		api  registryv1.RegistryClient
	}{{"a", a}, {"b", b}} {
		r, err := via.api.WaitApplied(ctx, &registryv1.WaitAppliedRequest{Service: "orders", Revision: d.Revision, Timeout: durationpb.New(time.Minute)})
		if err != nil {
			t.Fatal(err)
		}
		if !r.Done || r.Subscribers != 1 || len(r.Nodes) != 2 {
			t.Fatalf("WaitApplied through %s: %v, want done, b's one subscriber counted once, two regnodes", via.name, r)
		}
		for _, n := range r.Nodes {
			if want := map[string]string{"a": rns[0].api, "b": rns[1].advertise}[n.Node]; n.Address != want || n.Error != "" {
				t.Fatalf("WaitApplied through %s: regnode %s at %q (error %q), want it at %s", via.name, n.Node, n.Address, n.Error, want)
			}
		}
	}
	if err := st.CloseSend(); err != nil {
		t.Fatal(err)
	}
	cancel()
	<-acked
}
