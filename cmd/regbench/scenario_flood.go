package main

import (
	"context"
	"fmt"
	"net"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/prometheus/client_golang/prometheus/testutil"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/credentials/insecure"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/types/known/durationpb"

	"github.com/regcluster/registry/client"
	"github.com/regcluster/registry/internal/node"
	"github.com/regcluster/registry/internal/peerlimit"
	registryv1 "github.com/regcluster/registry/proto/registry/v1"
)

// Modes of the flood: who the regnode's limits take the attacker and the
// victim to be.
const (
	// floodPeer: auth off, the limits key by peer address, and the two
	// are two addresses of one host (Linux routes all of 127.0.0.0/8 to
	// the loopback interface, so binding the client's source address
	// makes two peers).
	floodPeer = "peer"
	// floodToken: auth on (--auth), the limits key by token name, and
	// both call from 127.0.0.1: only their tokens tell them apart.
	floodToken = "token"
)

// Addresses of the flood's peers.
const (
	attackerIP = "127.0.0.2"
	victimIP   = "127.0.0.1"
)

// Tokens of the flood's token mode, created with the first admin token.
const (
	attackerToken = "flood-attacker" // register on service flood
	victimToken   = "flood-victim"   // read on service victim
)

// runFlood: what a flood of Registers from one caller costs another, in
// each of -flood-modes (peer: auth off, two peer addresses; token: auth
// on, two tokens from one address). Per mode, one regnode with the
// default limits (but for -flood-cap and -flood-in-flight), on its own
// etcd (fsync on); the victim lists its service, one call after the
// other, first while nothing else runs (idle), then while the attacker
// sends a bounded flood of Registers as fast as its connections let it,
// in the same run. Reported per mode (cases MODE:attacker and
// MODE:victim_list): the attacker's accepted and refused calls (by
// limit), the victim's List latency during the flood against idle, and
// the victim's failures (want none).
func runFlood(ctx context.Context, e *env) (*Result, error) {
	cfg := e.cfg
	r := newResult("flood", "victim's List latency during a Register flood from another caller (ours) vs idle (baseline), "+
		"one regnode with default limits per mode (peer: auth off, two addresses; token: --auth, two tokens from 127.0.0.1), same run")
	limits := peerlimit.DefaultConfig()
	if cfg.floodCap > 0 {
		limits.MaxRegistrations = cfg.floodCap
	}
	if cfg.floodInFlight > 0 {
		limits.MaxWritesInFlight = cfg.floodInFlight
	}
	r.param("modes", strings.Join(cfg.floodModes, ","))
	r.param("flood_registers", cfg.floodN)
	r.param("flood_conc", cfg.floodConc)
	r.param("victim_idle_calls", cfg.floodCalls)
	r.param("victim_instances", cfg.floodInstances)
	r.param("write_rate", limits.WriteRate)
	r.param("write_burst", limits.WriteBurst)
	r.param("max_registrations", limits.MaxRegistrations)
	r.param("max_writes_in_flight", limits.MaxWritesInFlight)
	r.param("fsync", true)
	for _, mode := range cfg.floodModes {
		if err := floodOnce(ctx, e, r, mode, limits); err != nil {
			return r, fmt.Errorf("%s mode: %w", mode, err)
		}
	}
	r.skipRatio("failed", "registers_after_flood", "registers_after_flood_failed")
	r.note("the victim's calls are limited by nothing here (Lists are not rate limited); what they share with the attacker is the regnode's CPU, its etcd and the host: the ratio is that cost, the limits bound it to what the attacker's accepted Registers make")
	return r, nil
}

// floodOnce runs the flood in one mode on a regnode and etcd of its own,
// stopped before it returns, and records its figures in r.
func floodOnce(ctx context.Context, parent *env, r *Result, mode string, limits peerlimit.Config) error {
	cfg := parent.cfg
	e := &env{cfg: cfg, log: parent.log, progress: parent.progress}
	defer e.close()
	auth := mode == floodToken

	e.progress.set("%s: starting etcd (fsync on) and a regnode with default limits (auth %v)", mode, auth)
	etcd, err := startEtcd(ctx, e, true)
	if err != nil {
		return err
	}
	e.onClose(etcd.Close)
	var dataDir string
	if auth {
		// The regnode writes its first admin token into its data dir,
		// as `regnode --auth --data-dir` would.
		if dataDir, err = os.MkdirTemp("", "regbench-flood-auth-"); err != nil {
			return fmt.Errorf("data dir: %w", err)
		}
		e.onClose(func() { os.RemoveAll(dataDir) })
	}
	n, err := startNode(ctx, e, []string{etcd.URL}, func(c *node.Config) {
		c.Limits = limits
		if auth {
			c.Auth = true
			c.Embed.Dir = dataDir
		}
	})
	if err != nil {
		return err
	}
	e.onClose(func() { n.Close() })

	// Who is who: addresses in peer mode; tokens (and one address) in
	// token mode. The victim's own registrations are made by setup (the
	// admin, in token mode), since a read token cannot register.
	attackerFrom, victimFrom := attackerIP, victimIP
	var attackerTok, victimTok, setupTok string
	if auth {
		attackerFrom = victimIP
		if setupTok, attackerTok, victimTok, err = floodTokens(ctx, e, n.Addr(), filepath.Join(dataDir, node.AdminTokenFile)); err != nil {
			return err
		}
		r.param(mode+"_attacker", fmt.Sprintf("token %s (register, service flood) from %s", attackerToken, attackerFrom))
		r.param(mode+"_victim", fmt.Sprintf("token %s (read, service victim) from %s", victimToken, victimFrom))
	} else {
		r.param(mode+"_attacker", attackerFrom)
		r.param(mode+"_victim", victimFrom)
	}
	victim, closeV, err := dialFrom(n.Addr(), victimFrom, victimTok)
	if err != nil {
		return err
	}
	e.onClose(closeV)
	setup := victim
	if auth {
		admin, closeA, err := dialFrom(n.Addr(), victimFrom, setupTok)
		if err != nil {
			return err
		}
		e.onClose(closeA)
		setup = admin
	}
	// Several connections, as several attacking processes of one host
	// would open: one connection's stream cap does not bound the flood.
	attackers := make([]registryv1.RegistryClient, max(1, min(cfg.floodConc, 8)))
	for i := range attackers {
		api, closeA, err := dialFrom(n.Addr(), attackerFrom, attackerTok)
		if err != nil {
			return err
		}
		e.onClose(closeA)
		attackers[i] = api
	}

	for i := range cfg.floodInstances {
		if _, err := setup.Register(ctx, &registryv1.RegisterRequest{Instance: &registryv1.Instance{
			Service: "victim", Id: fmt.Sprint("v-", i), Address: "10.0.0.1:80"}, Ttl: durationpb.New(time.Minute)}); err != nil {
			return fmt.Errorf("victim's own registrations: %w", err)
		}
	}
	list := func() (time.Duration, error) {
		t := time.Now()
		resp, err := victim.List(ctx, &registryv1.ListRequest{Service: "victim"})
		if err == nil && len(resp.Instances) != cfg.floodInstances {
			err = fmt.Errorf("listed %d instances, want %d", len(resp.Instances), cfg.floodInstances)
		}
		return time.Since(t), err
	}
	// Warm the victim's path, then measure it idle.
	for range min(20, cfg.floodCalls) {
		if _, err := list(); err != nil {
			return fmt.Errorf("victim's List: %w", err)
		}
	}
	e.progress.set("%s: victim idle: %d Lists", mode, cfg.floodCalls)
	idle := make([]time.Duration, 0, cfg.floodCalls)
	idleFailed := 0
	for range cfg.floodCalls {
		d, err := list()
		if err != nil {
			if ctx.Err() != nil {
				return ctx.Err()
			}
			idleFailed++
			continue
		}
		idle = append(idle, d)
	}

	// The flood, with the victim listing until it is over.
	var (
		next                               atomic.Int64
		accepted, byRate, byCap, otherErrs atomic.Int64
		firstOther                         atomic.Value
		wg                                 sync.WaitGroup
		floodDone                          = make(chan struct{})
		during                             []time.Duration
		duringFailed                       int
		firstVictimErr                     error
	)
	e.progress.set("%s: flood of %d Registers", mode, cfg.floodN)
	start := time.Now()
	for w := range cfg.floodConc {
		api := attackers[w%len(attackers)]
		wg.Add(1)
		go func() {
			defer wg.Done()
			for {
				i := next.Add(1)
				if i > int64(cfg.floodN) || ctx.Err() != nil {
					return
				}
				_, err := api.Register(ctx, &registryv1.RegisterRequest{Instance: &registryv1.Instance{
					Service: "flood", Id: fmt.Sprint("a-", i), Address: "10.0.0.2:80"}, Ttl: durationpb.New(time.Minute)})
				st := status.Convert(err)
				switch {
				case err == nil:
					accepted.Add(1)
				case st.Code() == codes.ResourceExhausted && strings.Contains(st.Message(), peerlimit.Registrations):
					byCap.Add(1)
				case st.Code() == codes.ResourceExhausted && strings.Contains(st.Message(), peerlimit.WriteRate):
					byRate.Add(1)
				default:
					otherErrs.Add(1)
					firstOther.CompareAndSwap(nil, err)
				}
			}
		}()
	}
	go func() { wg.Wait(); close(floodDone) }()
	for flooding := true; flooding; {
		select {
		case <-floodDone:
			flooding = false
			continue
		default:
		}
		d, err := list()
		if err != nil {
			if ctx.Err() != nil {
				break
			}
			duringFailed++
			if firstVictimErr == nil {
				firstVictimErr = err
			}
			continue
		}
		during = append(during, d)
	}
	<-floodDone
	floodTime := time.Since(start)
	if ctx.Err() != nil {
		return ctx.Err()
	}
	if err, ok := firstOther.Load().(error); ok {
		return fmt.Errorf("attacker: %d Registers failed otherwise than limited, first: %w", otherErrs.Load(), err)
	}

	// The attacker now holds what it was let hold (its cap, in a flood
	// past it) and may have drained its write bucket: the victim's side
	// registering more of its own must not be refused for it, which is
	// what keying the limits by token (or peer) buys.
	const afterN = 5
	afterFailed := 0
	var firstAfterErr error
	for i := range afterN {
		if _, err := setup.Register(ctx, &registryv1.RegisterRequest{Instance: &registryv1.Instance{
			Service: "victim", Id: fmt.Sprint("v-after-", i), Address: "10.0.0.1:80"}, Ttl: durationpb.New(time.Minute)}); err != nil {
			if ctx.Err() != nil {
				return ctx.Err()
			}
			afterFailed++
			if firstAfterErr == nil {
				firstAfterErr = err
			}
		}
	}

	vc, ac := mode+":victim_list", mode+":attacker"
	limited := byRate.Load() + byCap.Load()
	r.ours(vc, "latency_ms", summarize(during))
	r.ours(vc, "failed", duringFailed)
	r.base("idle", vc, "latency_ms", summarize(idle))
	r.base("idle", vc, "failed", idleFailed)
	r.ours(vc, "registers_after_flood", afterN)
	r.ours(vc, "registers_after_flood_failed", afterFailed)
	r.ours(ac, "sent", int(accepted.Load()+limited))
	r.ours(ac, "accepted", int(accepted.Load()))
	r.ours(ac, "limited", int(limited))
	r.ours(ac, "limited_write_rate", int(byRate.Load()))
	r.ours(ac, "limited_registrations", int(byCap.Load()))
	r.ours(ac, "flood_s", round3(floodTime.Seconds()))
	r.ours(ac, "per_sec", round3(float64(accepted.Load()+limited)/floodTime.Seconds()))
	m := n.Metrics()
	r.ours(ac, "regnode_limited_total", int(testutil.ToFloat64(m.Limited.WithLabelValues(peerlimit.WriteRate))+
		testutil.ToFloat64(m.Limited.WithLabelValues(peerlimit.Registrations))))

	fl, il := summarize(during), summarize(idle)
	r.target(mode+": attacker limited", "> 0 of the flood refused", fmt.Sprintf("%d of %d (%d write rate, %d registrations cap)",
		limited, cfg.floodN, byRate.Load(), byCap.Load()), limited > 0)
	got := fmt.Sprintf("%d failed of %d during the flood, %d of %d idle", duringFailed, len(during)+duringFailed, idleFailed, len(idle)+idleFailed)
	if firstVictimErr != nil {
		got += "; first: " + firstVictimErr.Error()
	}
	r.target(mode+": victim's Lists all succeed", "0 failed", got, duringFailed == 0 && idleFailed == 0)
	got = fmt.Sprintf("%d failed of %d", afterFailed, afterN)
	if firstAfterErr != nil {
		got += "; first: " + firstAfterErr.Error()
	}
	r.target(mode+": victim's Registers after the flood all succeed", "0 failed", got, afterFailed == 0)
	if il.P50 > 0 && il.P99 > 0 {
		r.note("%s: victim List p50 %.2fms idle, %.2fms during the flood (x%.2f); p99 %.2fms idle, %.2fms during (x%.2f); %d Lists during a flood of %.2fs",
			mode, il.P50, fl.P50, fl.P50/il.P50, il.P99, fl.P99, fl.P99/il.P99, len(during), floodTime.Seconds())
	}
	return nil
}

// floodTokens reads the first admin token the regnode at addr wrote to
// file and creates, with it, the attacker's register token (service
// flood) and the victim's read token (service victim), through the
// Tokens API of the SDK.
func floodTokens(ctx context.Context, e *env, addr, file string) (admin, attacker, victim string, err error) {
	b, err := os.ReadFile(file)
	if err != nil {
		return "", "", "", fmt.Errorf("the first admin token: %w", err)
	}
	admin = strings.TrimSpace(string(b))
	var c *client.Client
	labeled(sideClient, func() { c, err = client.New(client.Config{Endpoints: []string{addr}, Logger: e.log, Token: admin}) })
	if err != nil {
		return "", "", "", fmt.Errorf("admin client: %w", err)
	}
	defer c.Close()
	create := func(name string, role registryv1.TokenRole, service string) (string, error) {
		resp, err := c.Tokens().CreateToken(ctx, &registryv1.CreateTokenRequest{Name: name, Role: role,
			Scope: &registryv1.TokenScope{Kind: registryv1.TokenScope_KIND_SERVICE, Value: service}})
		if err != nil {
			return "", fmt.Errorf("create token %s: %w", name, err)
		}
		return resp.Secret, nil
	}
	if attacker, err = create(attackerToken, registryv1.TokenRole_TOKEN_ROLE_REGISTER, "flood"); err != nil {
		return "", "", "", err
	}
	if victim, err = create(victimToken, registryv1.TokenRole_TOKEN_ROLE_READ, "victim"); err != nil {
		return "", "", "", err
	}
	return admin, attacker, victim, nil
}

// bearer sends a token on every call, as the SDK's Config.Token does
// (plaintext: the regnode is on loopback).
type bearer string

func (b bearer) GetRequestMetadata(context.Context, ...string) (map[string]string, error) {
	return map[string]string{"authorization": "Bearer " + string(b)}, nil
}

func (bearer) RequireTransportSecurity() bool { return false }

// dialFrom is a plain gRPC connection to addr whose source address is
// local: a peer of its own to the regnode's per-peer limits. A token, if
// not empty, goes with every call.
func dialFrom(addr, local, tok string) (registryv1.RegistryClient, func(), error) {
	d := net.Dialer{LocalAddr: &net.TCPAddr{IP: net.ParseIP(local)}}
	opts := []grpc.DialOption{grpc.WithTransportCredentials(insecure.NewCredentials()),
		grpc.WithContextDialer(func(ctx context.Context, a string) (net.Conn, error) { return d.DialContext(ctx, "tcp", a) })}
	if tok != "" {
		opts = append(opts, grpc.WithPerRPCCredentials(bearer(tok)))
	}
	var (
		cc  *grpc.ClientConn
		err error
	)
	labeled(sideClient, func() { cc, err = grpc.NewClient("passthrough:///"+addr, opts...) })
	if err != nil {
		return nil, nil, fmt.Errorf("dial %s from %s: %w", addr, local, err)
	}
	return registryv1.NewRegistryClient(cc), func() { cc.Close() }, nil
}
