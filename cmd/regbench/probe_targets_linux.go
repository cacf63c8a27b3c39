package main

import (
	"bufio"
	"fmt"
	"io"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"time"
)

// The probe scenario's targets: TCP listeners, one per checked instance,
// that cost next to nothing. Two kinds, both real listeners a probe
// connects to and resets:
//
//   - Timed listeners accept. The kernel completes a probe's handshake
//     without the target (SYN-ACK from the listen queue), but a connection
//     the prober then resets is NOT taken off the accept queue: Linux
//     keeps it there, dead, until accept (measured: 5,000 connects and
//     resets on a listener that never accepts left 4,097 in its queue, and
//     once it was full every further SYN was dropped and the connect timed
//     out). So they accept, without a goroutine or a netpoller wake-up per
//     connection: every timed listener is in one epoll set, one loop
//     accepts what is ready (accept4 until EAGAIN) and closes it at once.
//     That still costs the target about 20 µs a probe (accept4, close of a
//     dead socket, its share of an epoll_wait): measured, 0.37 cores at
//     18,500 probes a second, taken from the regnodes on a 2-core machine.
//   - Deferred listeners (TCP_DEFER_ACCEPT, as nginx's "listen ...
//     deferred") never accept: the kernel answers the SYN and the prober's
//     connect succeeds, but the bare ACK that ends the handshake leaves the
//     connection embryonic (waiting for data), and the prober's reset then
//     drops it (TcpExtEmbryonicRsts). No socket is ever created for it, no
//     system call is made by the target, and the listen queue stays empty
//     (measured: 20,000 connects and resets on a backlog of 16, none
//     failed, Recv-Q 0). A closed deferred listener refuses like any other.
//
// The loop times every accept of a timed listener, which is the
// per-instance measurement of "probed within 1.5x its interval": for each
// timed listener, the longest gap between two probes in a window (the
// window's start and end count as probes, so one never probed shows the
// whole window). Which listeners are timed is a fixed stride over their
// indexes; the prober cannot tell them apart, and which regnode owns an
// instance is a hash of its name, so the timed ones are a uniform sample.

// targetSet is the child's listeners and their timing.
type targetSet struct {
	ep   int
	base time.Time // timestamps are nanoseconds since base (monotonic)

	mu       sync.Mutex
	fds      []int   // -1 once killed
	timed    []bool  // accepts and is timed; otherwise deferred
	last     []int64 // last accept in the window
	maxGap   []int64
	accepts  int64 // in the window
	measured int   // listeners [0, measured) are measured
	ip, port int   // the next address to try: 127.77.ip/256.ip%256:port
	every    int   // listener i is timed when (first+i)%every == 0
	first    int   // the global index of this child's listener 0
}

const (
	targetPortLo, targetPortHi = 20000, 32767 // below the ephemeral range: connects never take them
	targetBacklog              = 1024
	targetBatch                = 20 * time.Millisecond
)

func newTargetSet() (*targetSet, error) {
	ep, err := syscall.EpollCreate1(syscall.EPOLL_CLOEXEC)
	if err != nil {
		return nil, fmt.Errorf("epoll_create1: %w", err)
	}
	return &targetSet{ep: ep, base: time.Now(), ip: 1, port: targetPortLo, every: 1}, nil
}

func (t *targetSet) now() int64 { return int64(time.Since(t.base)) }

// add opens k more listeners and returns their addresses. An address
// someone else holds is skipped.
func (t *targetSet) add(k int) ([]string, error) {
	var out []string
	for len(out) < k {
		if t.ip > 65000 {
			return out, fmt.Errorf("out of loopback addresses")
		}
		a := [4]byte{127, 77, byte(t.ip >> 8), byte(t.ip)}
		port := t.port
		if t.port++; t.port > targetPortHi {
			t.ip, t.port = t.ip+1, targetPortLo
		}
		fd, err := syscall.Socket(syscall.AF_INET, syscall.SOCK_STREAM|syscall.SOCK_NONBLOCK|syscall.SOCK_CLOEXEC, 0)
		if err != nil {
			return out, fmt.Errorf("socket (after %d listeners): %w", len(t.fds), err)
		}
		if err := syscall.Bind(fd, &syscall.SockaddrInet4{Port: port, Addr: a}); err != nil {
			syscall.Close(fd)
			continue
		}
		t.mu.Lock()
		i := len(t.fds)
		timed := (t.first+i)%t.every == 0
		t.mu.Unlock()
		if !timed {
			// Longer than any probe lives: the reset always comes first.
			if err := syscall.SetsockoptInt(fd, syscall.IPPROTO_TCP, syscall.TCP_DEFER_ACCEPT, 3600); err != nil {
				syscall.Close(fd)
				return out, fmt.Errorf("TCP_DEFER_ACCEPT: %w", err)
			}
		}
		if err := syscall.Listen(fd, targetBacklog); err != nil {
			syscall.Close(fd)
			return out, fmt.Errorf("listen: %w", err)
		}
		t.mu.Lock()
		t.fds = append(t.fds, fd)
		t.timed = append(t.timed, timed)
		t.last = append(t.last, 0)
		t.maxGap = append(t.maxGap, 0)
		t.mu.Unlock()
		if timed {
			ev := syscall.EpollEvent{Events: syscall.EPOLLIN, Fd: int32(i)}
			if err := syscall.EpollCtl(t.ep, syscall.EPOLL_CTL_ADD, fd, &ev); err != nil {
				return out, fmt.Errorf("epoll_ctl: %w", err)
			}
		}
		out = append(out, fmt.Sprintf("%d.%d.%d.%d:%d", a[0], a[1], a[2], a[3], port))
	}
	return out, nil
}

// loop accepts and closes every connection until stop is closed; it checks
// stop at least every 100ms.
func (t *targetSet) loop(stop <-chan struct{}) {
	evs := make([]syscall.EpollEvent, 256)
	for {
		select {
		case <-stop:
			return
		default:
		}
		n, err := syscall.EpollWait(t.ep, evs, 100)
		if err != nil {
			continue // EINTR
		}
		if n == 0 {
			continue
		}
		now := t.now()
		t.mu.Lock()
		for _, ev := range evs[:n] {
			i := int(ev.Fd)
			fd := t.fds[i]
			if fd < 0 {
				continue
			}
			got := 0
			for {
				// accept4(fd, NULL, NULL): no address wanted, nothing allocated.
				nfd, _, e := syscall.Syscall6(syscall.SYS_ACCEPT4, uintptr(fd), 0, 0, syscall.SOCK_CLOEXEC, 0, 0)
				if e != 0 {
					break
				}
				syscall.Close(int(nfd))
				got++
			}
			if got > 0 && i < t.measured {
				t.accepts += int64(got)
				if g := now - t.last[i]; g > t.maxGap[i] {
					t.maxGap[i] = g
				}
				t.last[i] = now
			}
		}
		t.mu.Unlock()
		// Let connections gather: one wake-up then serves many (a wake-up
		// per probe cost the targets ~60 µs a probe, more than the probe
		// itself); a gap is then timed to within this pause.
		time.Sleep(targetBatch)
	}
}

// start begins a window over the first n listeners.
func (t *targetSet) start(n int) {
	t.mu.Lock()
	defer t.mu.Unlock()
	now := t.now()
	t.measured = min(n, len(t.fds))
	t.accepts = 0
	for i := range t.measured {
		t.last[i], t.maxGap[i] = now, 0
	}
}

// stop ends the window: the accepts in it and, per measured listener, its
// longest gap in milliseconds (-1 for a killed one, -2 for a deferred
// one).
func (t *targetSet) stop() (int64, []int64) {
	t.mu.Lock()
	defer t.mu.Unlock()
	now := t.now()
	gaps := make([]int64, t.measured)
	for i := range t.measured {
		if t.fds[i] < 0 {
			gaps[i] = -1
			continue
		}
		if !t.timed[i] {
			gaps[i] = -2
			continue
		}
		gaps[i] = max(t.maxGap[i], now-t.last[i]) / int64(time.Millisecond)
	}
	n := t.accepts
	t.measured = 0
	return n, gaps
}

// kill closes listener i: its address refuses connections from now on.
func (t *targetSet) kill(i int) error {
	t.mu.Lock()
	defer t.mu.Unlock()
	if i < 0 || i >= len(t.fds) || t.fds[i] < 0 {
		return fmt.Errorf("no listener %d", i)
	}
	err := syscall.Close(t.fds[i])
	t.fds[i] = -1
	return err
}

func (t *targetSet) close() {
	t.mu.Lock()
	defer t.mu.Unlock()
	for i, fd := range t.fds {
		if fd >= 0 {
			syscall.Close(fd)
			t.fds[i] = -1
		}
	}
	syscall.Close(t.ep)
}

// probeTargetsMain is the target child: see probeTargetsArg.
func probeTargetsMain(stdin io.Reader, stdout io.Writer) int {
	var lim syscall.Rlimit
	if err := syscall.Getrlimit(syscall.RLIMIT_NOFILE, &lim); err == nil && lim.Cur < lim.Max {
		lim.Cur = lim.Max
		_ = syscall.Setrlimit(syscall.RLIMIT_NOFILE, &lim)
	}
	t, err := newTargetSet()
	if err != nil {
		fmt.Fprintf(stdout, "err %v\n", err)
		return 1
	}
	stop, done := make(chan struct{}), make(chan struct{})
	go func() { defer close(done); t.loop(stop) }()
	defer func() { close(stop); <-done; t.close() }()

	w := bufio.NewWriterSize(stdout, 1<<20)
	sc := bufio.NewScanner(stdin)
	for sc.Scan() {
		f := strings.Fields(sc.Text())
		if len(f) == 0 {
			continue
		}
		arg := -1
		if len(f) > 1 {
			arg, _ = strconv.Atoi(f[1])
		}
		switch f[0] {
		case "add":
			addrs, err := t.add(arg)
			if err != nil {
				fmt.Fprintf(w, "err %v\n", err)
				break
			}
			fmt.Fprintf(w, "add %s\n", strings.Join(addrs, " "))
		case "every":
			// every E BASE: from now on, listener i is timed when
			// (BASE+i)%E == 0 (BASE: this child's first global index).
			base := 0
			if len(f) > 2 {
				base, _ = strconv.Atoi(f[2])
			}
			if arg < 1 || base < 0 {
				fmt.Fprintf(w, "err every %q: want a positive stride and a base >= 0\n", f[1:])
				break
			}
			t.mu.Lock()
			t.every, t.first = arg, base
			t.mu.Unlock()
			fmt.Fprintln(w, "every")
		case "start":
			t.start(arg)
			fmt.Fprintln(w, "start")
		case "stop":
			n, gaps := t.stop()
			fmt.Fprintf(w, "stop %d", n)
			for _, g := range gaps {
				fmt.Fprintf(w, " %d", g)
			}
			fmt.Fprintln(w)
		case "kill":
			if err := t.kill(arg); err != nil {
				fmt.Fprintf(w, "err %v\n", err)
				break
			}
			fmt.Fprintf(w, "kill %d\n", time.Now().UnixNano())
		default:
			fmt.Fprintf(w, "err unknown command %q\n", f[0])
		}
		if err := w.Flush(); err != nil {
			return 1
		}
	}
	return 0
}
