package dnsapi

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"net/netip"
	"strconv"
	"sync"
	"syscall"
	"time"

	"github.com/miekg/dns"

	"github.com/regcluster/registry/internal/configerr"
)

// maxQueryBytes is the largest query read over UDP; a longer datagram is
// cut there, does not decode, and is dropped.
const maxQueryBytes = 4096

// Server answers DNS queries over UDP and TCP from a registry view. New
// makes it, Listen binds its sockets, Serve serves until its context ends;
// Close releases sockets that Serve never took.
type Server struct {
	cfg    Config
	domain string
	ttl    uint32
	log    *slog.Logger
	limit  *sources

	mu  sync.Mutex
	udp *net.UDPConn
	tcp net.Listener
}

// New checks cfg (Validate, and View is required) and returns a Server
// that listens on nothing yet.
func New(cfg Config) (*Server, error) {
	if err := cfg.Validate(); err != nil {
		return nil, err
	}
	if cfg.View == nil {
		return nil, configerr.Required(ErrInvalidConfig, "dnsapi", "View")
	}
	domain, _ := canonicalDomain(cfg.Domain)
	log := cfg.Logger
	if log == nil {
		log = slog.Default()
	}
	return &Server{cfg: cfg, domain: domain, ttl: uint32(cfg.TTL / time.Second), log: log,
		limit: newSources(cfg.Rate, cfg.Burst, cfg.MaxSources)}, nil
}

// Listen binds Config.Listen over UDP, then TCP on the same port (with
// port 0, the port UDP got; tried again on another if TCP has it taken).
func (s *Server) Listen() error {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.udp != nil {
		return errors.New("dnsapi: already listening")
	}
	host, port, _ := net.SplitHostPort(s.cfg.Listen)
	for attempt := 0; ; attempt++ {
		u, err := net.ListenPacket("udp", s.cfg.Listen)
		if err != nil {
			return fmt.Errorf("listen for DNS on udp %s: %w", s.cfg.Listen, err)
		}
		uc := u.(*net.UDPConn)
		got := strconv.Itoa(uc.LocalAddr().(*net.UDPAddr).Port)
		t, err := net.Listen("tcp", net.JoinHostPort(host, got))
		if err != nil {
			uc.Close()
			if port == "0" && errors.Is(err, syscall.EADDRINUSE) && attempt < 10 {
				continue
			}
			return fmt.Errorf("listen for DNS on tcp %s: %w", net.JoinHostPort(host, got), err)
		}
		s.udp, s.tcp = uc, t
		return nil
	}
}

// Addr is the address served (UDP and TCP alike), "" before Listen.
func (s *Server) Addr() string {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.udp == nil {
		return ""
	}
	return s.udp.LocalAddr().String()
}

// Close closes the sockets if Serve has not taken them (Serve closes them
// itself). It is idempotent.
func (s *Server) Close() error {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.udp != nil {
		s.udp.Close()
		s.tcp.Close()
	}
	return nil
}

// Serve answers queries on the sockets Listen bound until ctx ends, then
// stops both servers and returns once every query in flight is answered
// or its connection closed. It returns early, with the error, if either
// server fails on its own.
func (s *Server) Serve(ctx context.Context) error {
	s.mu.Lock()
	udp, tcp := s.udp, s.tcp
	s.mu.Unlock()
	if udp == nil {
		return errors.New("dnsapi: Serve before Listen")
	}
	servers := []*dns.Server{
		{PacketConn: udp, UDPSize: maxQueryBytes},
		{Listener: tcp, ReadTimeout: 2 * time.Second, IdleTimeout: func() time.Duration { return 8 * time.Second }},
	}
	type ended struct {
		i   int
		err error
	}
	done := make(chan ended, len(servers))
	started := make([]chan struct{}, len(servers))
	for i, srv := range servers {
		started[i] = make(chan struct{})
		srv.Handler, srv.MsgAcceptFunc, srv.DecorateReader = s, s.accept, s.decorate
		srv.WriteTimeout = 2 * time.Second
		srv.NotifyStartedFunc = func() { close(started[i]) }
		go func() { done <- ended{i, srv.ActivateAndServe()} }()
	}
	running := len(servers)
	var err error
	for i := range servers {
		// Shutdown refuses a server that has not started: wait for it
		// (or for its failure to start).
		select {
		case <-started[i]:
		case e := <-done:
			running--
			err = errors.Join(err, fmt.Errorf("DNS server %d: %w", e.i, e.err))
		}
	}
	if err == nil {
		select {
		case <-ctx.Done():
		case e := <-done:
			running--
			err = fmt.Errorf("DNS server %d stopped: %w", e.i, e.err)
		}
	}
	for _, srv := range servers {
		srv.Shutdown() // "not started" for the one that failed: nothing to do
	}
	for ; running > 0; running-- {
		if e := <-done; e.err != nil && ctx.Err() == nil {
			err = errors.Join(err, e.err)
		}
	}
	udp.Close()
	tcp.Close()
	return err
}

// ServeDNS answers one decoded query (dns.Handler).
func (s *Server) ServeDNS(w dns.ResponseWriter, req *dns.Msg) {
	defer func() {
		// A bug here must not take the registry down with it.
		if r := recover(); r != nil {
			s.log.Error("DNS query handler panicked; query dropped", "panic", r, "question", req.Question)
			s.count(ResultServFail)
		}
	}()
	_, tcp := w.RemoteAddr().(*net.TCPAddr)
	m, result := s.reply(req, s.replySize(req, tcp))
	s.count(result)
	if err := w.WriteMsg(m); err != nil {
		s.log.Debug("DNS reply not sent", "remote", w.RemoteAddr(), "err", err)
	}
}

// replySize is how large a reply to req may be: MaxTCPBytes over TCP; over
// UDP, the buffer size an EDNS0 query advertises (at least 512, at most
// MaxUDPSize), else 512.
func (s *Server) replySize(req *dns.Msg, tcp bool) int {
	if tcp {
		return MaxTCPBytes
	}
	if opt := req.IsEdns0(); opt != nil {
		return min(max(int(opt.UDPSize()), dns.MinMsgSize), s.cfg.MaxUDPSize)
	}
	return dns.MinMsgSize
}

func (s *Server) count(result string) {
	if s.cfg.OnQuery != nil {
		s.cfg.OnQuery(result)
	}
}

func (s *Server) ready() bool {
	if s.cfg.Ready == nil {
		return true
	}
	select {
	case <-s.cfg.Ready:
		return true
	default:
		return false
	}
}

// accept judges a decoded query's header before the handler sees it
// (dns.MsgAcceptFunc): miekg's server answers FORMERR or NOTIMP itself to
// what it rejects. admit dropped responses already.
func (s *Server) accept(h dns.Header) dns.MsgAcceptAction {
	switch {
	case int(h.Bits>>11)&0xF != dns.OpcodeQuery:
		s.count(ResultNotImp)
		return dns.MsgRejectNotImplemented
	case h.Qdcount != 1 || h.Ancount > 0 || h.Nscount > 0 || h.Arcount > 2:
		s.count(ResultFormErr)
		return dns.MsgReject
	}
	return dns.MsgAccept
}

// admit is the gate every packet read passes before a goroutine is spent
// on it: a source past its rate, or a packet that does not decode as a
// query, is dropped (UDP) or ends its connection (TCP) with no reply, which
// no spoofed source can use to amplify.
func (s *Server) admit(m []byte, from net.Addr) bool {
	var src netip.Addr
	switch a := from.(type) {
	case *net.UDPAddr:
		src = a.AddrPort().Addr().Unmap()
	case *net.TCPAddr:
		src = a.AddrPort().Addr().Unmap()
	}
	if !s.limit.allow(src, time.Now()) {
		s.count(ResultRateLimited)
		return false
	}
	if _, ok := decode(m); !ok {
		s.count(ResultMalformed)
		return false
	}
	return true
}

// decode unpacks m as a query: false for anything that does not unpack, or
// is a response.
func decode(m []byte) (*dns.Msg, bool) {
	req := new(dns.Msg)
	if err := req.Unpack(m); err != nil || req.Response {
		return nil, false
	}
	return req, true
}

// errDropped ends a TCP connection whose query admit refused.
var errDropped = errors.New("dnsapi: query dropped")

// decorate puts admit in front of the server's reader (dns.DecorateReader).
func (s *Server) decorate(r dns.Reader) dns.Reader { return gate{r, s} }

type gate struct {
	dns.Reader
	s *Server
}

func (g gate) ReadUDP(conn *net.UDPConn, timeout time.Duration) ([]byte, *dns.SessionUDP, error) {
	for {
		m, sess, err := g.Reader.ReadUDP(conn, timeout)
		if err != nil || g.s.admit(m, sess.RemoteAddr()) {
			return m, sess, err
		}
	}
}

func (g gate) ReadTCP(conn net.Conn, timeout time.Duration) ([]byte, error) {
	m, err := g.Reader.ReadTCP(conn, timeout)
	if err != nil || g.s.admit(m, conn.RemoteAddr()) {
		return m, err
	}
	return nil, errDropped
}
