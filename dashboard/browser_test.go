package dashboard_test

import (
	"context"
	"fmt"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/chromedp/chromedp"
	"go.uber.org/goleak"
	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials/insecure"
	"google.golang.org/protobuf/types/known/durationpb"

	"github.com/regcluster/registry/client"
	"github.com/regcluster/registry/internal/embedded"
	"github.com/regcluster/registry/internal/etcdtest"
	"github.com/regcluster/registry/internal/node"
	"github.com/regcluster/registry/internal/regnodetest"
	registryv1 "github.com/regcluster/registry/proto/registry/v1"
	"github.com/regcluster/registry/record"
)

func TestMain(m *testing.M) {
	goleak.VerifyTestMain(m, append(etcdtest.LeakOptions(),
		goleak.IgnoreAnyFunction("net/http.(*persistConn).readLoop"),
		goleak.IgnoreAnyFunction("net/http.(*persistConn).writeLoop"),
		goleak.IgnoreAnyFunction("net/http.(*connReader).backgroundRead"),
		goleak.IgnoreAnyFunction("net/http.(*conn).serve"),
	)...)
}

// chromium finds Debian's chromium. Without it the browser tests skip,
// unless REGISTRY_REQUIRE_BROWSER is set (CI sets it), when they fail.
func chromium(t *testing.T) string {
	t.Helper()
	for _, name := range []string{"chromium", "chromium-browser"} {
		if p, err := exec.LookPath(name); err == nil {
			return p
		}
	}
	if os.Getenv("REGISTRY_REQUIRE_BROWSER") != "" {
		t.Fatal("chromium is not installed and REGISTRY_REQUIRE_BROWSER is set: apt-get install -y chromium")
	}
	t.Skip("skipping the browser tests: chromium is not installed (apt-get install -y chromium; set REGISTRY_REQUIRE_BROWSER=1 to make this a failure)")
	return ""
}

// browser starts a headless chromium with a fresh profile and no
// background traffic (this machine's network is closed), and returns a tab.
func browser(t *testing.T, ctx context.Context) context.Context {
	t.Helper()
	alloc, cancelAlloc := chromedp.NewExecAllocator(ctx,
		chromedp.ExecPath(chromium(t)),
		chromedp.Headless, chromedp.NoSandbox, chromedp.DisableGPU, chromedp.NoFirstRun, chromedp.NoDefaultBrowserCheck,
		chromedp.Flag("disable-background-networking", true),
		chromedp.Flag("disable-component-update", true),
		chromedp.Flag("disable-sync", true),
		chromedp.Flag("disable-quic", true),
		chromedp.UserDataDir(t.TempDir()),
		chromedp.WindowSize(1400, 1000),
	)
	tab, cancelTab := chromedp.NewContext(alloc)
	t.Cleanup(func() {
		cancelTab()
		cancelAlloc() // waits for the browser process to exit
	})
	return tab
}

// screenshot saves the whole page to testdata/out (ignored by git), for a
// person to look at.
func screenshot(t *testing.T, tab context.Context, name string) {
	t.Helper()
	png, err := chromedp.Run(tab, chromedp.FullScreenshot(100)) // quality 100 is PNG; below is JPEG
	if err != nil {
		t.Fatalf("screenshot %s: %v", name, err)
	}
	dir := filepath.Join("testdata", "out")
	if err := os.MkdirAll(dir, 0o755); err != nil {
		t.Fatal(err)
	}
	p := filepath.Join(dir, name+".png")
	if err := os.WriteFile(p, png, 0o644); err != nil {
		t.Fatal(err)
	}
	t.Logf("screenshot: %s", p)
}

// poll waits until the JavaScript expression is true in the page.
func poll(t *testing.T, tab context.Context, what, expr string) {
	t.Helper()
	ctx, cancel := context.WithTimeout(tab, 15*time.Second)
	defer cancel()
	if _, err := chromedp.Run(ctx, chromedp.Poll[bool](expr, chromedp.WithPollingInterval(20*time.Millisecond))); err != nil {
		body, _ := chromedp.Run(tab, chromedp.Evaluate[string](`document.body.innerText`))
		t.Fatalf("waiting for %s (%s): %v\npage:\n%s", what, expr, err, body)
	}
}

// onLiveNode runs an action on a node the page may re-render meanwhile
// (every update replaces the table's rows): a node chromedp found and
// lost before it acted is looked up again, a bounded number of times.
// Only that error is retried, and it comes before any input is sent.
func onLiveNode(t *testing.T, tab context.Context, what string, a chromedp.Action[chromedp.Void]) {
	t.Helper()
	for i := 0; ; i++ {
		err := chromedp.Do(tab, a)
		if err == nil {
			return
		}
		if i == 20 || !strings.Contains(err.Error(), "Could not find node") {
			t.Fatalf("%s: %v (attempt %d)", what, err, i+1)
		}
	}
}

// cell is the expression of the text of a column of an instance's row.
func cell(key, col string) string {
	return fmt.Sprintf(`(document.querySelector('tr[data-key="%s"] [data-col="%s"]')||{}).textContent`, key, col)
}

// lifecycleInEtcd reads the instance's lifecycle straight from etcd.
func lifecycleInEtcd(t *testing.T, rn *regnodetest.Regnode, service, id string) registryv1.Lifecycle {
	t.Helper()
	keys := record.NewKeys(rn.Prefix)
	r, err := rn.Etcd.Get(context.Background(), keys.Instance(service, id))
	if err != nil || len(r.Kvs) != 1 {
		t.Fatalf("read %s/%s from etcd: %v", service, id, err)
	}
	inst, err := keys.Decode(string(r.Kvs[0].Key), r.Kvs[0].Value, r.Kvs[0].CreateRevision, r.Kvs[0].ModRevision)
	if err != nil {
		t.Fatal(err)
	}
	return inst.Lifecycle
}

func waitEtcd(t *testing.T, rn *regnodetest.Regnode, service, id string, want registryv1.Lifecycle) {
	t.Helper()
	deadline := time.Now().Add(10 * time.Second)
	for lifecycleInEtcd(t, rn, service, id) != want {
		if time.Now().After(deadline) {
			t.Fatalf("%s/%s in etcd is %v, want %v", service, id, lifecycleInEtcd(t, rn, service, id), want)
		}
		time.Sleep(10 * time.Millisecond)
	}
}

// The dashboard in a real chromium against a real regnode: it shows what
// is registered, follows registrations and health changes live without a
// reload, and its drain button (clicked, and pressed with the keyboard)
// changes the record in etcd.
func TestDashboardInBrowser(t *testing.T) {
	chromium(t) // skip before starting anything
	rn := regnodetest.Start(t)
	cc, err := grpc.NewClient(rn.Addr, grpc.WithTransportCredentials(insecure.NewCredentials()))
	if err != nil {
		t.Fatal(err)
	}
	defer cc.Close()
	rpc := registryv1.NewRegistryClient(cc)
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	// An hour's lease: the test keeps nothing alive, and the default 10s
	// would delete the instances mid-test.
	if _, err := rpc.Register(ctx, &registryv1.RegisterRequest{Ttl: durationpb.New(time.Hour), Instance: &registryv1.Instance{
		Service: "orders", Id: "o-1", Address: "127.0.0.1:9001", Zone: "eu-1a", Version: "v1.4.2", Weight: 250}}); err != nil {
		t.Fatal(err)
	}
	tab := browser(t, ctx)
	url := "http://" + rn.Node.MetricsAddr() + "/"

	t.Run("shows a registered instance", func(t *testing.T) {
		if err := chromedp.Do(tab, chromedp.Navigate(url), chromedp.WaitVisible(chromedp.CSS(`tr[data-key="orders/o-1"]`))); err != nil {
			t.Fatal(err)
		}
		poll(t, tab, "o-1's address, lifecycle, weight, zone and version",
			cell("orders/o-1", "address")+` === "127.0.0.1:9001" && `+cell("orders/o-1", "lifecycle")+` === "SERVING" && `+
				cell("orders/o-1", "weight")+` === "250" && `+cell("orders/o-1", "zone")+` === "eu-1a" && `+
				cell("orders/o-1", "version")+` === "v1.4.2" && `+cell("orders/o-1", "health")+` === "UNKNOWN"`)
		poll(t, tab, "the services table counting o-1",
			`document.querySelector('#services tr[data-service="orders"] [data-col="total"]').textContent === "1" && `+
				`document.querySelector('#services tr[data-service="orders"] [data-col="unknown"]').textContent === "1"`)
		poll(t, tab, "the prober leader, the etcd member and the revisions",
			fmt.Sprintf(`document.getElementById("leader").textContent === %q && `+
				`document.querySelectorAll('#members tbody tr').length === 1 && `+
				`document.querySelector('#members tbody tr[data-member="rn"]') !== null && `+
				`Number(document.getElementById("revision").textContent) > 0 && `+
				`document.getElementById("compact").textContent !== "–" && `+
				`document.getElementById("conn").textContent === "live"`, rn.Node.Name()))
	})

	// A listener that answers TCP probes, until it is closed.
	lis, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer lis.Close()
	go func() { // accept and drop: a TCP check only connects
		for {
			c, err := lis.Accept()
			if err != nil {
				return
			}
			c.Close()
		}
	}()

	var reg2 *registryv1.RegisterResponse
	t.Run("a new registration appears without a reload", func(t *testing.T) {
		if _, err := chromedp.Run(tab, chromedp.Evaluate[bool](`window.__sameDocument = true`)); err != nil {
			t.Fatal(err)
		}
		reg2, err = rpc.Register(ctx, &registryv1.RegisterRequest{Ttl: durationpb.New(time.Hour), Instance: &registryv1.Instance{
			Service: "orders", Id: "o-2", Address: lis.Addr().String(), Zone: "eu-1b", Version: "v1.5.0",
			Check: &registryv1.HealthCheck{Kind: registryv1.CheckKind_CHECK_KIND_TCP, Interval: durationpb.New(200 * time.Millisecond)}}})
		if err != nil {
			t.Fatal(err)
		}
		poll(t, tab, "o-2's row", cell("orders/o-2", "address")+fmt.Sprintf(` === %q`, lis.Addr().String()))
		poll(t, tab, "the services table counting 2", `document.querySelector('#services tr[data-service="orders"] [data-col="total"]').textContent === "2"`)
		poll(t, tab, "the same document (no reload)", `window.__sameDocument === true`)
		poll(t, tab, "the revision shown to reach o-2's", fmt.Sprintf(`Number(document.getElementById("revision").textContent) >= %d`, reg2.Revision))
	})

	t.Run("a health change shows", func(t *testing.T) {
		poll(t, tab, "o-2 HEALTHY", cell("orders/o-2", "health")+`.startsWith("HEALTHY")`)
		lis.Close() // probes now fail: HEALTHY -> DEGRADED after 3 failures
		poll(t, tab, "o-2 DEGRADED with a reason", cell("orders/o-2", "health")+`.startsWith("DEGRADED") && `+cell("orders/o-2", "reason")+` !== ""`)
		poll(t, tab, "the services table counting o-2 degraded", `document.querySelector('#services tr[data-service="orders"] [data-col="degraded"]').textContent === "1"`)
		poll(t, tab, "the same document (no reload)", `window.__sameDocument === true`)
		screenshot(t, tab, "dashboard-health")
	})

	t.Run("a drain click changes the record in etcd", func(t *testing.T) {
		btn := chromedp.CSS(`tr[data-key="orders/o-1"] button`)
		onLiveNode(t, tab, "click Drain", chromedp.Click(btn))
		waitEtcd(t, rn, "orders", "o-1", registryv1.Lifecycle_LIFECYCLE_DRAINING)
		poll(t, tab, "o-1 DRAINING with an Undrain button and the drain reason",
			cell("orders/o-1", "lifecycle")+` === "DRAINING" && document.querySelector('tr[data-key="orders/o-1"] button').textContent === "Undrain" && `+
				cell("orders/o-1", "reason")+`.includes("drained: from the dashboard")`)
		screenshot(t, tab, "dashboard-drained")

		// With the keyboard: focus the button, press Enter; focus stays on
		// the instance's button after the page re-renders.
		onLiveNode(t, tab, "focus Undrain", chromedp.Focus(btn))
		if err := chromedp.Do(tab, chromedp.KeyEvent("\r")); err != nil {
			t.Fatal(err)
		}
		waitEtcd(t, rn, "orders", "o-1", registryv1.Lifecycle_LIFECYCLE_SERVING)
		poll(t, tab, "o-1 SERVING with a Drain button that still has the focus",
			cell("orders/o-1", "lifecycle")+` === "SERVING" && document.activeElement.textContent === "Drain" && `+
				`document.activeElement.closest("tr").dataset.key === "orders/o-1"`)
		screenshot(t, tab, "dashboard-keyboard-focus")
	})

	// The status panel follows etcd without a reload or a reconnect: it
	// is refreshed while progress arrives, so a compaction (which no
	// instance event carries) shows.
	t.Run("a compaction shows", func(t *testing.T) {
		poll(t, tab, "no Status call in flight", `__statusCalls.started === __statusCalls.done`)
		before, err := chromedp.Run(tab, chromedp.Evaluate[int](`__statusCalls.done`))
		if err != nil {
			t.Fatal(err)
		}
		r, err := rn.Etcd.Get(ctx, "any")
		if err != nil {
			t.Fatal(err)
		}
		if _, err := rn.Etcd.Compact(ctx, r.Header.Revision); err != nil {
			t.Fatal(err)
		}
		poll(t, tab, "the compact revision from a later Status call", fmt.Sprintf(
			`__statusCalls.done > %d && document.getElementById("compact").textContent === "%d"`, before, r.Header.Revision))
		poll(t, tab, "the same document (no reload)", `window.__sameDocument === true`)
	})
}

// With --auth the dashboard asks for a token and sends it with every
// call, the watch stream included: without one it shows nothing and says
// what is needed; a read token shows the registry live but cannot drain
// (the regnode's 403 is shown, etcd unchanged); an operate token drains.
// The token never appears in the page's URL or in localStorage.
func TestDashboardWithTokens(t *testing.T) {
	chromium(t) // skip before starting anything
	m := etcdtest.Start(t, false)
	dir := t.TempDir()
	rn := regnodetest.StartWith(t, node.Config{EtcdEndpoints: []string{m.ClientURL}, Auth: true,
		Embed: embedded.Config{Dir: dir}}, m.ClientURL)
	b, err := os.ReadFile(filepath.Join(dir, node.AdminTokenFile))
	if err != nil {
		t.Fatal(err)
	}
	admin, err := client.New(client.Config{Endpoints: []string{rn.Addr}, Token: strings.TrimSpace(string(b))})
	if err != nil {
		t.Fatal(err)
	}
	defer admin.Close()
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	mk := func(name string, role registryv1.TokenRole) string {
		resp, err := admin.Tokens().CreateToken(ctx, &registryv1.CreateTokenRequest{Name: name, Role: role,
			Scope: &registryv1.TokenScope{Kind: registryv1.TokenScope_KIND_ALL}})
		if err != nil {
			t.Fatal(err)
		}
		return resp.Secret
	}
	readTok, operTok := mk("viewer", registryv1.TokenRole_TOKEN_ROLE_READ), mk("oncall", registryv1.TokenRole_TOKEN_ROLE_OPERATE)
	if _, err := admin.API().Register(ctx, &registryv1.RegisterRequest{Ttl: durationpb.New(time.Hour),
		Instance: &registryv1.Instance{Service: "web", Id: "w-1", Address: "127.0.0.1:9002"}}); err != nil {
		t.Fatal(err)
	}
	tab := browser(t, ctx)
	// The page empties the field once a token is used.
	useToken := func(t *testing.T, tok string) {
		t.Helper()
		if err := chromedp.Do(tab, chromedp.SendKeys(chromedp.CSS(`#token`), tok),
			chromedp.Click(chromedp.CSS(`#token-use`))); err != nil {
			t.Fatal(err)
		}
	}
	message := `document.getElementById("message").textContent`

	t.Run("without a token it shows nothing and asks for one", func(t *testing.T) {
		if err := chromedp.Do(tab, chromedp.Navigate("http://"+rn.Node.MetricsAddr()+"/"), chromedp.WaitVisible(chromedp.CSS(`#token`))); err != nil {
			t.Fatal(err)
		}
		poll(t, tab, "the page asking for a read token", message+`.includes("enter a read token") && `+
			`document.getElementById("conn").textContent === "needs a token"`)
		poll(t, tab, "no instance shown, and no claim that none is registered", `document.querySelectorAll("tr[data-key]").length === 0 && document.getElementById("no-services").hidden`)
		screenshot(t, tab, "dashboard-auth-no-token")
	})

	t.Run("a read token shows the registry but cannot drain", func(t *testing.T) {
		if _, err := chromedp.Run(tab, chromedp.Evaluate[bool](`window.__sameDocument = true`)); err != nil {
			t.Fatal(err)
		}
		useToken(t, readTok)
		poll(t, tab, "w-1 shown, live, with the prober leader", cell("web/w-1", "address")+` === "127.0.0.1:9002" && `+
			`document.getElementById("conn").textContent === "live" && `+
			fmt.Sprintf(`document.getElementById("leader").textContent === %q`, rn.Node.Name()))
		// Live: a registration made now appears without a reload.
		if _, err := admin.API().Register(ctx, &registryv1.RegisterRequest{Ttl: durationpb.New(time.Hour),
			Instance: &registryv1.Instance{Service: "web", Id: "w-2", Address: "127.0.0.1:9003"}}); err != nil {
			t.Fatal(err)
		}
		poll(t, tab, "w-2 appearing", cell("web/w-2", "address")+` === "127.0.0.1:9003" && window.__sameDocument === true`)
		onLiveNode(t, tab, "click Drain", chromedp.Click(chromedp.CSS(`tr[data-key="web/w-1"] button`)))
		poll(t, tab, "the regnode's refusal shown", message+`.includes("Could not drain web/w-1") && `+message+`.includes("needs role operate")`)
		if lc := lifecycleInEtcd(t, rn, "web", "w-1"); lc != registryv1.Lifecycle_LIFECYCLE_SERVING {
			t.Fatalf("a read token's drain changed etcd: %v", lc)
		}
		poll(t, tab, "the token kept in the tab only", fmt.Sprintf(`!location.href.includes(%q) && localStorage.length === 0 && `+
			`sessionStorage.getItem("registry-token") === %q`, readTok, readTok))
	})

	t.Run("an operate token drains", func(t *testing.T) {
		useToken(t, operTok)
		poll(t, tab, "w-1 shown again after the token change", cell("web/w-1", "lifecycle")+` === "SERVING"`)
		onLiveNode(t, tab, "click Drain", chromedp.Click(chromedp.CSS(`tr[data-key="web/w-1"] button`)))
		waitEtcd(t, rn, "web", "w-1", registryv1.Lifecycle_LIFECYCLE_DRAINING)
		poll(t, tab, "w-1 DRAINING", cell("web/w-1", "lifecycle")+` === "DRAINING" && window.__sameDocument === true`)
		screenshot(t, tab, "dashboard-auth-drained")
	})

	t.Run("forgetting the token hides the registry", func(t *testing.T) {
		if err := chromedp.Do(tab, chromedp.Click(chromedp.CSS(`#token-forget`))); err != nil {
			t.Fatal(err)
		}
		poll(t, tab, "nothing shown, a token asked for", `document.querySelectorAll("tr[data-key]").length === 0 && `+
			message+`.includes("enter a read token") && sessionStorage.getItem("registry-token") === null`)
	})
}

// The page follows its regnode across a restart without a reload: when
// the stream ends it says so and reconnects by itself, resuming after the
// last whole transaction it applied, and what changed meanwhile shows.
func TestDashboardReconnects(t *testing.T) {
	chromium(t) // skip before starting anything
	m := etcdtest.Start(t, false)
	httpAddr := fmt.Sprintf("127.0.0.1:%d", etcdtest.FreePort(t))
	// A generous shutdown grace: the page's requests in flight when the
	// regnode closes (its xDS list, asked on load) must not fail Close on
	// a loaded machine (CI once saw "stop metrics server: context
	// deadline exceeded" with regnodetest's 500ms).
	cfg := node.Config{EtcdEndpoints: []string{m.ClientURL}, Name: "rn-a", MetricsListen: httpAddr, ShutdownGrace: 10 * time.Second}
	first := regnodetest.StartWith(t, cfg, m.ClientURL)
	cc, err := grpc.NewClient(first.Addr, grpc.WithTransportCredentials(insecure.NewCredentials()))
	if err != nil {
		t.Fatal(err)
	}
	defer cc.Close()
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	if _, err := registryv1.NewRegistryClient(cc).Register(ctx, &registryv1.RegisterRequest{Ttl: durationpb.New(time.Hour),
		Instance: &registryv1.Instance{Service: "web", Id: "w-1", Address: "127.0.0.1:9002"}}); err != nil {
		t.Fatal(err)
	}
	tab := browser(t, ctx)
	if err := chromedp.Do(tab, chromedp.Navigate("http://"+httpAddr+"/"), chromedp.WaitVisible(chromedp.CSS(`tr[data-key="web/w-1"]`))); err != nil {
		t.Fatal(err)
	}
	poll(t, tab, "live", `document.getElementById("conn").textContent === "live"`)
	if _, err := chromedp.Run(tab, chromedp.Evaluate[bool](`window.__sameDocument = true`)); err != nil {
		t.Fatal(err)
	}

	if err := first.Node.Close(); err != nil {
		t.Fatal(err)
	}
	poll(t, tab, "the page saying it lost the stream", `document.getElementById("conn").textContent === "reconnecting…"`)
	// Meanwhile, straight in etcd's registry through another regnode: w-1
	// leaves and w-2 comes.
	other := regnodetest.StartExternal(t, m.ClientURL)
	cc2, err := grpc.NewClient(other.Addr, grpc.WithTransportCredentials(insecure.NewCredentials()))
	if err != nil {
		t.Fatal(err)
	}
	defer cc2.Close()
	rpc := registryv1.NewRegistryClient(cc2)
	if _, err := rpc.Deregister(ctx, &registryv1.DeregisterRequest{Service: "web", Id: "w-1"}); err != nil {
		t.Fatal(err)
	}
	if _, err := rpc.Register(ctx, &registryv1.RegisterRequest{Ttl: durationpb.New(time.Hour),
		Instance: &registryv1.Instance{Service: "web", Id: "w-2", Address: "127.0.0.1:9003"}}); err != nil {
		t.Fatal(err)
	}
	regnodetest.StartWith(t, cfg, m.ClientURL) // the regnode back, on the same HTTP port
	poll(t, tab, "w-2 shown and w-1 gone, live again, in the same document", cell("web/w-2", "address")+` === "127.0.0.1:9003" && `+
		`document.querySelector('tr[data-key="web/w-1"]') === null && document.getElementById("conn").textContent === "live" && window.__sameDocument === true`)
}
