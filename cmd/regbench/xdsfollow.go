package main

import (
	"context"
	"fmt"
	"sync"
	"time"

	corev3 "github.com/envoyproxy/go-control-plane/envoy/config/core/v3"
	discoverygrpc "github.com/envoyproxy/go-control-plane/envoy/service/discovery/v3"
	resourcev3 "github.com/envoyproxy/go-control-plane/pkg/resource/v3"
	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials/insecure"
)

// xdsFollowers are S xDS clients of one service as gRPC's own speak to
// regnode (state of the world over ADS, the node's user agent "gRPC Go",
// the service's endpoints named, each response acknowledged), each its
// own ADS stream, perClient streams to a connection. grpc-go shares one
// xDS client (one stream) per process and bootstrap, so S channels in one
// process would be one stream: these are S streams, what S gRPC
// processes cost the regnode. Each response's version is mapped by the
// regnode's xDS server to the revision it was built from (revOf).
type xdsFollowers struct {
	ctx    context.Context
	cancel context.CancelFunc
	conns  []*grpc.ClientConn
	wg     sync.WaitGroup
}

// startXDSFollowers opens S streams to addr following service, and
// returns once each has had its first response; follower i reports each
// response's revision to saw(i, ...).
func startXDSFollowers(ctx context.Context, addr, service string, S, perClient int, revOf func(string) int64, saw func(i int, rev int64, at time.Time)) (*xdsFollowers, error) {
	ctx, cancel := context.WithCancel(ctx)
	f := &xdsFollowers{ctx: ctx, cancel: cancel}
	first := make(chan error, S)
	for i := range S {
		if i%perClient == 0 {
			cc, err := grpc.NewClient(addr, grpc.WithTransportCredentials(insecure.NewCredentials()))
			if err != nil {
				f.stop()
				return nil, err
			}
			f.conns = append(f.conns, cc)
		}
		ads := discoverygrpc.NewAggregatedDiscoveryServiceClient(f.conns[len(f.conns)-1])
		f.wg.Add(1)
		labeled(sideClient, func() {
			go func() {
				defer f.wg.Done()
				if err := f.follow(ads, i, service, revOf, saw, first); err != nil {
					first <- err
				}
			}()
		})
	}
	for range S {
		if err := <-first; err != nil {
			f.stop()
			return nil, err
		}
	}
	return f, nil
}

// follow runs one stream until f stops; it sends nil on first after the
// first response, and returns the error that ended it before one (nil
// once it has sent).
func (f *xdsFollowers) follow(ads discoverygrpc.AggregatedDiscoveryServiceClient, i int, service string, revOf func(string) int64,
	saw func(int, int64, time.Time), first chan<- error) error {
	st, err := ads.StreamAggregatedResources(f.ctx)
	if err != nil {
		return err
	}
	node := &corev3.Node{Id: fmt.Sprintf("regbench-%d", i), UserAgentName: "gRPC Go"}
	req := &discoverygrpc.DiscoveryRequest{Node: node, TypeUrl: resourcev3.EndpointType, ResourceNames: []string{service}}
	if err := st.Send(req); err != nil {
		return err
	}
	told := false
	for {
		resp, err := st.Recv()
		now := time.Now()
		if err != nil {
			if !told {
				return fmt.Errorf("xDS follower %d: %w", i, err)
			}
			return nil
		}
		if rev := revOf(resp.VersionInfo); rev > 0 {
			saw(i, rev, now)
		}
		if err := st.Send(&discoverygrpc.DiscoveryRequest{TypeUrl: resourcev3.EndpointType, ResourceNames: []string{service},
			VersionInfo: resp.VersionInfo, ResponseNonce: resp.Nonce}); err != nil {
			return nil
		}
		if !told {
			told = true
			first <- nil
		}
	}
}

// stop ends every stream and waits for them.
func (f *xdsFollowers) stop() {
	f.cancel()
	f.wg.Wait()
	for _, c := range f.conns {
		c.Close()
	}
}
