// Package dnsapi serves the registry over DNS (github.com/miekg/dns), for
// callers without the SDK: a regnode's --dns-listen.
//
// # Names
//
// Under the domain D (default "registry."), for a service S and a zone Z:
//
//	S.service.D              A / AAAA: the IP addresses of S's routable instances
//	Z.S.service.D            the same, of S's instances in zone Z
//	_S._tcp.service.D        SRV: one record per routable instance (RFC 2782)
//	_S._tcp.Z.service.D      SRV of S's instances in zone Z
//	<hex>.addr.D             A / AAAA: an SRV target, the IP in hex (8 or 32 digits)
//	D                        SOA
//
// Every service name answers A, AAAA and SRV alike (dig SRV S.service.D
// works too). Service names may hold dots: "S.service.D" is read as the
// service S when one exists by that name, else its leading labels are the
// zone of the longest known service that ends the name. Zones are matched
// without regard to case.
//
// # Guarantees
//
//   - Only what the SDK would route to: instances that record.Routable
//     accepts (SERVING, and HEALTHY or DEGRADED, or UNKNOWN without a
//     check). DRAINING, STARTING, UNAVAILABLE and never-probed instances
//     are never in an answer.
//   - Served from the regnode's in-memory view (Config.View, the fan-out
//     hub's cache): no query reads etcd. Before the view is complete
//     (Config.Ready), queries get SERVFAIL, never a negative answer.
//   - Every record has TTL Config.TTL (default 5s, never 0); the SOA's
//     minimum, which resolvers cache negative answers for, is the same.
//   - An unknown service, or a zone none of a service's instances has, is
//     NXDOMAIN with the SOA in authority; a known service (or zone) with
//     nothing routable is NOERROR with no answer and the SOA. A name
//     outside D is REFUSED (this is no recursive resolver).
//   - A and AAAA hold each IP address once; an instance registered under
//     a host name is left out of them (no CNAME is made up), and is in SRV
//     answers with that host name as its target, which its own DNS
//     resolves. An IP target is named <hex>.addr.D, whose A or AAAA goes
//     in the additional section and is answered on its own too.
//   - SRV: priority 0; weight = the registry weight, 1..1000, as is
//     (record.EffectiveWeight: quartered while DEGRADED), so SRV clients
//     share traffic as the SDK does; instances at the same address and
//     port make one record with the sum of their weights.
//   - Records are shuffled afresh for every answer.
//   - Size: a reply never exceeds what the transport allows (miekg's
//     Msg.Truncate): over UDP 512 bytes without EDNS0, with EDNS0 the
//     buffer size the query advertises (at least 512, at most
//     Config.MaxUDPSize), the OPT record echoed; over TCP MaxTCPBytes
//     (60,000). TC is set whenever a record of the answer was left out
//     (the client should ask again over TCP); additional records that do
//     not fit are left out without TC (RFC 2181 §9), their targets
//     resolvable on their own.
//   - Abuse: each source IP may make Config.Rate queries a second (burst
//     Config.Burst); past it a UDP query is dropped and a TCP connection
//     closed, without a reply. Sources are tracked in at most
//     Config.MaxSources entries. A packet that does not decode as a query
//     (or is a response) is dropped the same way; nothing a client sends
//     can crash the server (FuzzServeDNS).
//   - Lifecycle: Serve owns every goroutine it starts (miekg's servers and
//     their per-query goroutines) and returns only once they are done.
package dnsapi
