package client_test

import (
	"context"
	"errors"
	"log/slog"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"go.uber.org/goleak"
	"google.golang.org/grpc/resolver"

	"github.com/regcluster/registry/client"
	"github.com/regcluster/registry/internal/regnodetest"
	registryv1 "github.com/regcluster/registry/proto/registry/v1"
	"github.com/regcluster/registry/record"
)

// Client.Close stops everything the Client made: a user Subscription on a
// context that never ends, the resolvers' shared subscriptions (one in
// use, one lingering), and a Registration, which it drains and
// deregisters while the subscriptions still run. Afterwards every call is
// refused with ErrClosed and no goroutine of the Client is left.
func TestCloseStopsWhatTheClientMade(t *testing.T) {
	rn := regnodetest.Start(t)
	st, err := storeFor(t, rn)
	if err != nil {
		t.Fatal(err)
	}
	ctx := context.Background()
	// The regnode leads (its prober runs) before the goroutines running
	// now, the regnode's and etcd's, are set aside.
	api := newClient(t, rn.Addr).API()
	waitFor(t, time.Minute, "the regnode to lead", func() bool {
		resp, err := api.Status(ctx, &registryv1.StatusRequest{})
		return err == nil && resp.GetLeader() != ""
	})
	before := goleak.IgnoreCurrent()

	c, err := client.New(client.Config{Endpoints: []string{rn.Addr}, Logger: slog.New(slog.DiscardHandler)})
	if err != nil {
		t.Fatal(err)
	}
	sub, err := c.Subscribe(ctx, "orders", client.SubscribeOptions{})
	if err != nil {
		t.Fatal(err)
	}
	wctx, cancel := context.WithTimeout(ctx, time.Minute)
	defer cancel()
	if err := sub.WaitReady(wctx); err != nil {
		t.Fatal(err)
	}
	b := c.ResolverBuilder()
	inUse, err := b.Build(resolver.Target{URL: *mustURL(t, "registry:///orders")}, &fakeConn{}, resolver.BuildOptions{})
	if err != nil {
		t.Fatal(err)
	}
	lingering, err := b.Build(resolver.Target{URL: *mustURL(t, "registry:///users")}, &fakeConn{}, resolver.BuildOptions{})
	if err != nil {
		t.Fatal(err)
	}
	lingering.Close() // its subscription stays for sharedLinger

	// When the registration reports itself deregistered, the user
	// subscription must still be running: registrations go first.
	var subAtDeregister atomic.Value // "running" or "stopped"
	reg, err := c.Register(ctx, &registryv1.Instance{Service: "orders", Id: "o-1", Address: "127.0.0.1:9000"},
		client.RegisterOptions{TTL: 30 * time.Second, DrainGrace: 50 * time.Millisecond, OnChange: func(s client.RegistrationStatus) {
			if !s.Closed {
				return
			}
			select {
			case <-sub.Done():
				subAtDeregister.Store("stopped")
			default:
				subAtDeregister.Store("running")
			}
		}})
	if err != nil {
		t.Fatal(err)
	}
	waitFor(t, time.Minute, "the subscription to see o-1", func() bool { return len(sub.Instances("orders")) == 1 })

	if err := c.Close(); err != nil {
		t.Fatalf("close: %v", err)
	}
	if got := subAtDeregister.Load(); got != "running" {
		t.Fatalf("when the registration was deregistered the client's subscription was %v, want running", got)
	}
	select {
	case <-sub.Done():
	default:
		t.Fatal("a subscription on a context that never ends still runs after Client.Close")
	}
	// Deregistered by Close, not left to expire with its 30s lease.
	if _, _, err := st.Get(ctx, "orders", "o-1"); !errors.Is(err, record.ErrNotFound) {
		t.Fatalf("o-1 after Close: %v, want record.ErrNotFound", err)
	}

	// Everything refuses, with ErrClosed.
	if _, err := c.Subscribe(ctx, "orders", client.SubscribeOptions{}); !errors.Is(err, client.ErrClosed) {
		t.Errorf("Subscribe after Close: %v", err)
	}
	if _, err := c.Register(ctx, &registryv1.Instance{Service: "orders", Id: "o-2", Address: "127.0.0.1:9001"}, client.RegisterOptions{}); !errors.Is(err, client.ErrClosed) {
		t.Errorf("Register after Close: %v", err)
	}
	if _, err := c.List(ctx, "orders", client.ListOptions{}); !errors.Is(err, client.ErrClosed) {
		t.Errorf("List after Close: %v", err)
	}
	if _, err := c.API().Status(ctx, &registryv1.StatusRequest{}); !errors.Is(err, client.ErrClosed) {
		t.Errorf("API().Status after Close: %v", err)
	}
	if _, err := b.Build(resolver.Target{URL: *mustURL(t, "registry:///orders")}, &fakeConn{}, resolver.BuildOptions{}); !errors.Is(err, client.ErrClosed) {
		t.Errorf("resolver Build after Close: %v", err)
	}
	if err := reg.Drain(ctx, "late"); !errors.Is(err, client.ErrClosed) {
		t.Errorf("Drain of a registration closed by Client.Close: %v", err)
	}
	if err := c.Close(); err != nil {
		t.Errorf("second close: %v", err)
	}
	inUse.Close() // grpc closes a resolver it built; after Client.Close that is harmless

	// The regnode's side of the client's streams ends once they are gone.
	waitFor(t, time.Minute, "the regnode to count no subscriber", func() bool { return rn.Node.Hub().Subscribers() == 0 })
	noLeaks(t, before)
}

// A Register still retrying its first registration (no regnode answers)
// is stopped by Client.Close with ErrClosed, and Close does not wait for
// it to give up by itself.
func TestCloseStopsRegisterInFlight(t *testing.T) {
	before := goleak.IgnoreCurrent()
	retrying := make(chan struct{})
	var once sync.Once
	log := slog.New(onWarn(func() { once.Do(func() { close(retrying) }) }))
	// A loopback port nobody listens on: every attempt fails.
	c, err := client.New(client.Config{Endpoints: []string{"127.0.0.1:1"}, Logger: log})
	if err != nil {
		t.Fatal(err)
	}
	errc := make(chan error, 1)
	go func() {
		_, err := c.Register(context.Background(), &registryv1.Instance{Service: "orders", Id: "o-1", Address: "127.0.0.1:9000"}, client.RegisterOptions{})
		errc <- err
	}()
	<-retrying // the first attempt failed: Register is retrying
	closed := make(chan error, 1)
	go func() { closed <- c.Close() }()
	select {
	case err := <-closed:
		if err != nil {
			t.Fatal(err)
		}
	case <-time.After(time.Minute): // only a Close that waits for Register to give up fails this
		t.Fatal("Close did not return while a Register was retrying")
	}
	if err := <-errc; !errors.Is(err, client.ErrClosed) {
		t.Fatalf("Register cut short by Close: %v, want ErrClosed", err)
	}
	noLeaks(t, before)
}

// onWarn is a slog handler that calls f on every record at warn level or
// above, and drops everything.
type onWarn func()

func (h onWarn) Enabled(context.Context, slog.Level) bool { return true }
func (h onWarn) Handle(_ context.Context, r slog.Record) error {
	if r.Level >= slog.LevelWarn {
		h()
	}
	return nil
}
func (h onWarn) WithAttrs([]slog.Attr) slog.Handler { return h }
func (h onWarn) WithGroup(string) slog.Handler      { return h }

// noLeaks waits (a minute at most: only a leak fails it) until no
// goroutine is left but those of opts; the other side of a closed
// connection ends in its own time.
func noLeaks(t *testing.T, opts ...goleak.Option) {
	t.Helper()
	deadline := time.Now().Add(time.Minute)
	for {
		err := goleak.Find(opts...)
		if err == nil {
			return
		}
		if time.Now().After(deadline) {
			t.Fatal(err)
		}
	}
}

func TestNegativeCloseTimeoutIsRefused(t *testing.T) {
	_, err := client.New(client.Config{Endpoints: []string{"127.0.0.1:1"}, CloseTimeout: -time.Second})
	var fe *record.FieldError
	if !errors.As(err, &fe) || fe.Field != "Config.CloseTimeout" {
		t.Fatalf("New with a negative CloseTimeout: %v, want a FieldError naming Config.CloseTimeout", err)
	}
}

// A subscription whose context has already ended stops at once, and with
// it the disk cache's loader and writer: nothing of it runs after Done.
func TestSubscriptionOnEndedContextLeavesNothing(t *testing.T) {
	before := goleak.IgnoreCurrent()
	c, err := client.New(client.Config{Endpoints: []string{"127.0.0.1:1"}, CacheDir: t.TempDir(), Logger: slog.New(slog.DiscardHandler)})
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	cancel()
	for range 20 {
		sub, err := c.Subscribe(ctx, "orders", client.SubscribeOptions{})
		if err != nil {
			t.Fatal(err)
		}
		<-sub.Done()
	}
	if err := c.Close(); err != nil {
		t.Fatal(err)
	}
	noLeaks(t, before)
}
