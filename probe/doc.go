// Package probe runs real health probes against instances (a TCP connect,
// an HTTP GET, a grpc.health.v1 Check) and reports each as a health.Result
// for the health state machine.
//
// A probe never returns an error: everything that can go wrong is an
// Outcome with a Detail a person can read. A timeout (the probe's deadline
// passed) is always told apart from an error (refused, reset, DNS...) and
// from an unhealthy answer (HTTP non-2xx, gRPC NOT_SERVING). Latency is
// measured with the monotonic clock, and an OK slower than the slow
// threshold is reported as health.Slow (health.Classify).
//
// The checks, by registry.v1 CheckKind:
//
//	TCP   connect to the address and close with a reset (SO_LINGER 0, so
//	      no TIME_WAIT is left behind): OK if the connection opens.
//	HTTP  GET http://<address><target>: 2xx is OK; any other status is
//	      Unhealthy ("HTTP 503"; a 4xx is "the health endpoint's contract
//	      failed"; a 3xx is never followed).
//	GRPC  grpc.health.v1.Health/Check with service = target: SERVING is OK;
//	      NOT_SERVING, SERVICE_UNKNOWN and a server without the health
//	      service are Unhealthy.
//	NONE  no probe at all: OK.
//
// Every probe says who sends it (Config.Agent): HTTP probes send
// User-Agent "regnode/<version> (<node>)", gRPC probes a user-agent that
// starts with it and metadata x-registry-prober: <node>.
//
// A Checker holds the resources probes reuse: one HTTP transport with a
// bounded pool of keep-alive connections (one per instance, closed after
// 90s idle), and a bounded cache of gRPC ClientConns, one per address,
// closed after 90s unused, by Forget or by Close. It is safe for
// concurrent use by many goroutines.
package probe
