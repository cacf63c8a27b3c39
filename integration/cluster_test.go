package integration

import (
	"fmt"
	"net"
	"os"
	"path/filepath"
	"testing"
)

// A regnode that cannot bind an address it was given (another process
// took the port after it was picked) is told apart from one that fails
// otherwise: StartCluster starts again with new ports instead of failing.
func TestWaitServingReportsAddressInUse(t *testing.T) {
	taken, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer taken.Close()
	c := &Cluster{t: t, bin: regnodeBin}
	nd := &Node{Name: "n1", dir: t.TempDir(),
		API:       fmt.Sprintf("127.0.0.1:%d", freePort(t)),
		Metrics:   taken.Addr().String(),
		ClientURL: fmt.Sprintf("http://127.0.0.1:%d", freePort(t)),
		PeerURL:   fmt.Sprintf("http://127.0.0.1:%d", freePort(t))}
	nd.env = append(os.Environ(), "REGNODE_NAME=n1", "REGNODE_LISTEN="+nd.API, "REGNODE_METRICS_LISTEN="+nd.Metrics,
		"REGNODE_DATA_DIR="+filepath.Join(nd.dir, "data"),
		"REGNODE_LISTEN_CLIENT_URLS="+nd.ClientURL, "REGNODE_LISTEN_PEER_URLS="+nd.PeerURL,
		"REGNODE_INITIAL_CLUSTER=n1="+nd.PeerURL, "REGNODE_LOG_LEVEL=warn")
	c.Nodes = []*Node{nd}
	c.start(nd)
	t.Cleanup(c.stopAll)
	if !c.waitServing(nd) {
		t.Fatalf("a regnode whose metrics address was taken served:\n%s", nd.Stderr())
	}
}
