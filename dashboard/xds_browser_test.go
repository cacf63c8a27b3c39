package dashboard_test

import (
	"context"
	"fmt"
	"testing"
	"time"

	"github.com/chromedp/chromedp"
	corev3 "github.com/envoyproxy/go-control-plane/envoy/config/core/v3"
	discoverygrpc "github.com/envoyproxy/go-control-plane/envoy/service/discovery/v3"
	resourcev3 "github.com/envoyproxy/go-control-plane/pkg/resource/v3"
	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials/insecure"
	"google.golang.org/protobuf/types/known/durationpb"

	"github.com/regcluster/registry/internal/regnodetest"
	registryv1 "github.com/regcluster/registry/proto/registry/v1"
)

// xdsCell is the expression of the text of a column of an xDS client's
// row, by node id.
func xdsCell(nodeID, col string) string {
	return fmt.Sprintf(`(document.querySelector('#xds tr[data-node-id="%s"] [data-col="%s"]')||{}).textContent`, nodeID, col)
}

// The "xDS clients" section lists a raw ADS stream of a real regnode: its
// regnode, node id, kind, protocol, the service it follows and that it is
// not behind once it ACKed; this regnode's alone too; gone, after a
// refresh, once the stream ends.
func TestDashboardListsXDSClients(t *testing.T) {
	chromium(t) // skip before starting anything
	rn := regnodetest.Start(t)
	cc, err := grpc.NewClient(rn.Addr, grpc.WithTransportCredentials(insecure.NewCredentials()))
	if err != nil {
		t.Fatal(err)
	}
	defer cc.Close()
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	if _, err := registryv1.NewRegistryClient(cc).Register(ctx, &registryv1.RegisterRequest{Ttl: durationpb.New(time.Hour),
		Instance: &registryv1.Instance{Service: "orders", Id: "o-1", Address: "127.0.0.1:9001"}}); err != nil {
		t.Fatal(err)
	}
	sctx, endStream := context.WithCancel(ctx)
	defer endStream()
	ss, err := discoverygrpc.NewAggregatedDiscoveryServiceClient(cc).StreamAggregatedResources(sctx)
	if err != nil {
		t.Fatal(err)
	}
	req := &discoverygrpc.DiscoveryRequest{Node: &corev3.Node{Id: "checkout-7", UserAgentName: "gRPC Go"},
		TypeUrl: resourcev3.EndpointType, ResourceNames: []string{"orders"}}
	if err := ss.Send(req); err != nil {
		t.Fatal(err)
	}
	go func() { // ACKs every response, as a client does, until the stream ends
		for {
			resp, err := ss.Recv()
			if err != nil {
				return
			}
			req.VersionInfo, req.ResponseNonce = resp.VersionInfo, resp.Nonce
			if ss.Send(req) != nil {
				return
			}
		}
	}()

	tab := browser(t, ctx)
	if err := chromedp.Do(tab, chromedp.Navigate("http://"+rn.Node.MetricsAddr()+"/")); err != nil {
		t.Fatal(err)
	}
	listed := fmt.Sprintf(xdsCell("checkout-7", "node")+` === %q && `+xdsCell("checkout-7", "kind")+` === "grpc" && `+
		xdsCell("checkout-7", "protocol")+` === "sotw" && `+xdsCell("checkout-7", "services")+` === "orders" && `+
		xdsCell("checkout-7", "nacks")+` === "0"`, rn.Node.Name())
	// The first answer may come before the ACK: Refresh until it is taken.
	for i := 0; ; i++ {
		poll(t, tab, "the xDS client listed", listed)
		ok, err := chromedp.Run(tab, chromedp.Evaluate[bool](xdsCell("checkout-7", "behind")+` === "no"`))
		if err != nil {
			t.Fatal(err)
		}
		if ok {
			break
		}
		if i == 100 {
			t.Fatal("the xDS client never shown as caught up")
		}
		onLiveNode(t, tab, "refresh", chromedp.Click(chromedp.CSS(`#xds-refresh`)))
		time.Sleep(50 * time.Millisecond)
	}
	screenshot(t, tab, "xds-clients")

	// This regnode's only: the same client.
	onLiveNode(t, tab, "this regnode only", chromedp.Click(chromedp.CSS(`#xds-all`)))
	poll(t, tab, "the local list answered", `window.__xdsCalls.started === window.__xdsCalls.done && !document.getElementById("xds-all").checked`)
	poll(t, tab, "the xDS client listed by this regnode alone", listed)

	// Its stream ends: gone at the next refresh.
	endStream()
	for i := 0; ; i++ {
		onLiveNode(t, tab, "refresh", chromedp.Click(chromedp.CSS(`#xds-refresh`)))
		poll(t, tab, "the refresh answered", `window.__xdsCalls.started === window.__xdsCalls.done`)
		gone, err := chromedp.Run(tab, chromedp.Evaluate[bool](`document.querySelector('#xds tr[data-node-id="checkout-7"]') === null && !document.getElementById("no-xds").hidden`))
		if err != nil {
			t.Fatal(err)
		}
		if gone {
			break
		}
		if i == 100 {
			t.Fatal("the ended stream is still listed")
		}
		time.Sleep(50 * time.Millisecond)
	}
}
