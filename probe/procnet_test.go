package probe

import (
	"bufio"
	"os"
	"runtime"
	"strconv"
	"strings"
	"testing"
)

// tcpTimeWait is the state TIME_WAIT in /proc/net/tcp{,6}.
const tcpTimeWait = "06"

// socket is one line of /proc/net/tcp or /proc/net/tcp6.
type socket struct {
	ends          string // "local remote", as the file writes them: the connection
	local, remote int    // ports
	state         string
}

// hostSockets lists the host's TCP sockets (this network namespace's) from
// /proc/net/tcp and /proc/net/tcp6; it skips the test off Linux.
func hostSockets(t testing.TB) []socket {
	t.Helper()
	if runtime.GOOS != "linux" {
		t.Skip("reads /proc/net/tcp: Linux only")
	}
	var out []socket
	for _, name := range []string{"/proc/net/tcp", "/proc/net/tcp6"} {
		f, err := os.Open(name)
		if os.IsNotExist(err) && name == "/proc/net/tcp6" {
			continue // no IPv6
		}
		if err != nil {
			t.Skipf("cannot read the host's sockets: %v", err)
		}
		sc := bufio.NewScanner(f)
		sc.Scan() // the header
		for sc.Scan() {
			// sl local_address rem_address st ...: addresses are HEXIP:HEXPORT
			fields := strings.Fields(sc.Text())
			if len(fields) < 4 {
				continue
			}
			out = append(out, socket{ends: fields[1] + " " + fields[2], local: hexPort(fields[1]), remote: hexPort(fields[2]), state: fields[3]})
		}
		err = sc.Err()
		_ = f.Close()
		if err != nil {
			t.Fatalf("%s: %v", name, err)
		}
	}
	return out
}

func hexPort(addr string) int {
	_, port, _ := strings.Cut(addr, ":")
	n, _ := strconv.ParseUint(port, 16, 16)
	return int(n)
}

// addrPort is the port of a host:port.
func addrPort(t testing.TB, addr string) int {
	t.Helper()
	i := strings.LastIndexByte(addr, ':')
	n, err := strconv.Atoi(addr[i+1:])
	if err != nil {
		t.Fatalf("port of %q: %v", addr, err)
	}
	return n
}

// proberSide counts the host's sockets connected to port (the prober's
// ends of connections to a target listening on port), by state.
func proberSide(t testing.TB, port int) map[string]int {
	t.Helper()
	n := map[string]int{}
	for _, s := range hostSockets(t) {
		if s.remote == port {
			n[s.state]++
		}
	}
	return n
}
