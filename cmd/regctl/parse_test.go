package main

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"reflect"
	"strings"
	"testing"
	"time"

	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/proto"
	"google.golang.org/protobuf/types/known/durationpb"

	"github.com/regcluster/registry/client"
	registryv1 "github.com/regcluster/registry/proto/registry/v1"
	"github.com/regcluster/registry/record"
)

func isUsage(err error) bool {
	var ue *usageError
	return errors.As(err, &ue)
}

func TestParseServiceID(t *testing.T) {
	for _, tc := range []struct {
		arg         string
		service, id string
	}{
		{"orders/o-1", "orders", "o-1"},
		{"a.b-c/ID_x.9", "a.b-c", "ID_x.9"},
	} {
		s, id, err := parseServiceID(tc.arg)
		if err != nil || s != tc.service || id != tc.id {
			t.Errorf("parseServiceID(%q) = %q, %q, %v", tc.arg, s, id, err)
		}
	}
	for _, arg := range []string{
		"", "orders", "/o-1", "orders/", "Orders/o-1", "orders/o/1", "orders/o 1",
		"-orders/o-1", "orders/..", strings.Repeat("a", 64) + "/x",
	} {
		if _, _, err := parseServiceID(arg); !isUsage(err) {
			t.Errorf("parseServiceID(%q) = %v, want a usage error", arg, err)
		}
	}
}

func TestParseMeta(t *testing.T) {
	md, err := parseMeta([]string{"az=eu-1a", "url=http://x/?a=b", "empty="})
	want := map[string]string{"az": "eu-1a", "url": "http://x/?a=b", "empty": ""}
	if err != nil || !reflect.DeepEqual(md, want) {
		t.Errorf("parseMeta = %v, %v; want %v", md, err, want)
	}
	if md, err := parseMeta(nil); md != nil || err != nil {
		t.Errorf("parseMeta(nil) = %v, %v", md, err)
	}
	for _, bad := range [][]string{{"novalue"}, {"=v"}, {"k=1", "k=2"}} {
		if _, err := parseMeta(bad); !isUsage(err) {
			t.Errorf("parseMeta(%q) = %v, want a usage error", bad, err)
		}
	}
	// The registry's rules: printable keys of 63 characters at most, values
	// of 1 KiB at most without control characters, 64 entries at most.
	var many []string
	for i := range record.MaxMetadata {
		many = append(many, fmt.Sprintf("k%d=v", i))
	}
	for _, good := range [][]string{
		many, {strings.Repeat("k", 63) + "=v"}, {"k=" + strings.Repeat("v", 1024)}, {"k=a value with spaces"},
	} {
		if _, err := parseMeta(good); err != nil {
			t.Errorf("parseMeta(%.40q...) = %v", good, err)
		}
	}
	for _, tc := range []struct {
		kvs  []string
		want string
	}{
		{append(many, "one=more"), "65 --meta entries, at most 64"},
		{[]string{strings.Repeat("k", 64) + "=v"}, "64 characters, at most 63"},
		{[]string{"k=" + strings.Repeat("v", 1025)}, "1025 bytes, at most 1024"},
		{[]string{"a b=v"}, "control, space or unprintable"},
		{[]string{"a\x01=v"}, "control, space or unprintable"},
		{[]string{"k=line\nforged"}, "control character"},
		{[]string{"k=\xff"}, "not valid UTF-8"},
	} {
		_, err := parseMeta(tc.kvs)
		if !isUsage(err) || !strings.Contains(err.Error(), tc.want) {
			t.Errorf("parseMeta(%.40q...) = %v, want a usage error with %q", tc.kvs, err, tc.want)
		}
	}
}

func TestParseCheck(t *testing.T) {
	sec, half, neg := time.Second, 500*time.Millisecond, -time.Second
	for _, tc := range []struct {
		spec              string
		interval, timeout *time.Duration
		want              *registryv1.HealthCheck
	}{
		{"", nil, nil, nil},
		{"none", nil, nil, nil},
		{"tcp", nil, nil, &registryv1.HealthCheck{Kind: registryv1.CheckKind_CHECK_KIND_TCP}},
		{"TCP", nil, nil, &registryv1.HealthCheck{Kind: registryv1.CheckKind_CHECK_KIND_TCP}},
		{"http:/healthz", nil, nil, &registryv1.HealthCheck{Kind: registryv1.CheckKind_CHECK_KIND_HTTP, Target: "/healthz"}},
		{"http:/a:b?c", nil, nil, &registryv1.HealthCheck{Kind: registryv1.CheckKind_CHECK_KIND_HTTP, Target: "/a:b?c"}},
		{"grpc", nil, nil, &registryv1.HealthCheck{Kind: registryv1.CheckKind_CHECK_KIND_GRPC}},
		{"grpc:orders.v1.Orders", nil, nil, &registryv1.HealthCheck{Kind: registryv1.CheckKind_CHECK_KIND_GRPC, Target: "orders.v1.Orders"}},
		{"tcp", &sec, &half, &registryv1.HealthCheck{Kind: registryv1.CheckKind_CHECK_KIND_TCP,
			Interval: durationpb.New(time.Second), Timeout: durationpb.New(500 * time.Millisecond)}},
	} {
		got, err := parseCheck(tc.spec, tc.interval, tc.timeout)
		if err != nil || !proto.Equal(got, tc.want) {
			t.Errorf("parseCheck(%q) = %v, %v; want %v", tc.spec, got, err, tc.want)
		}
	}
	for _, tc := range []struct {
		spec              string
		interval, timeout *time.Duration
	}{
		{"http", nil, nil}, {"http:", nil, nil}, {"http:healthz", nil, nil}, {"grpc:", nil, nil},
		{"tcp:80", nil, nil}, {"udp", nil, nil}, {"bogus:/x", nil, nil},
		{"", &sec, nil}, {"none", nil, &half}, {"tcp", &neg, nil}, {"tcp", nil, &neg},
	} {
		if _, err := parseCheck(tc.spec, tc.interval, tc.timeout); !isUsage(err) {
			t.Errorf("parseCheck(%q, %v, %v) = %v, want a usage error", tc.spec, tc.interval, tc.timeout, err)
		}
	}
}

func TestParseOutputAndEndpoints(t *testing.T) {
	for _, ok := range []string{"table", "wide", "json"} {
		if _, err := parseOutput(ok); err != nil {
			t.Errorf("parseOutput(%q) = %v", ok, err)
		}
	}
	for _, bad := range []string{"", "yaml", "JSON"} {
		if _, err := parseOutput(bad); !isUsage(err) {
			t.Errorf("parseOutput(%q) = %v, want a usage error", bad, err)
		}
	}
	eps, err := parseEndpoints(" 127.0.0.1:7400, ,[::1]:7401,node-2:7400")
	if want := []string{"127.0.0.1:7400", "[::1]:7401", "node-2:7400"}; err != nil || !reflect.DeepEqual(eps, want) {
		t.Errorf("parseEndpoints = %v, %v; want %v", eps, err, want)
	}
	for _, bad := range []string{"", ",", "nohost", "h:0", "h:70000", "http://h:1"} {
		if _, err := parseEndpoints(bad); !isUsage(err) {
			t.Errorf("parseEndpoints(%q) = %v, want a usage error", bad, err)
		}
	}
	// Each says what is wrong, by the registry's address rules.
	for ep, want := range map[string]string{
		"127.0.0.1:99999": `invalid endpoint "127.0.0.1:99999": port 99999 is out of range 1..65535`,
		"10.0.0.1:+80":    `port "+80" is not a decimal number`,
		"10.0.0.1:0080":   `port "0080" has a leading zero`,
		"300.1.1.1:80":    `host "300.1.1.1" is neither an IP address nor a DNS name`,
		"a b c:80":        `host "a b c" is neither`,
		"nohost":          `invalid endpoint "nohost": not host:port (missing port in address)`,
		"[10.0.0.1]:80":   "only an IPv6 address",
	} {
		if _, err := parseEndpoints(ep); !isUsage(err) || !strings.Contains(err.Error(), want) {
			t.Errorf("parseEndpoints(%q) = %v, want a usage error with %q", ep, err, want)
		}
	}
}

func TestResolveEndpoints(t *testing.T) {
	env := func(v string) func(string) string {
		return func(k string) string {
			if k == envEndpoints {
				return v
			}
			return ""
		}
	}
	for _, tc := range []struct {
		flag, env string
		want      []string
	}{
		{"", "", []string{client.DefaultEndpoint}},
		{"", "a:1,b:2", []string{"a:1", "b:2"}},
		{"c:3", "a:1", []string{"c:3"}},
	} {
		o := &options{endpointsFlag: tc.flag, getenv: env(tc.env)}
		got, err := o.resolveEndpoints()
		if err != nil || !reflect.DeepEqual(got, tc.want) {
			t.Errorf("flag %q env %q: %v, %v; want %v", tc.flag, tc.env, got, err, tc.want)
		}
	}
}

func TestDescribe(t *testing.T) {
	o := &options{endpoints: []string{"127.0.0.1:7400"}, timeout: 2 * time.Second}
	for _, tc := range []struct {
		err  error
		want string
		code int
	}{
		{status.Error(codes.InvalidArgument, "invalid weight: 5000 is outside 1..1000"), "invalid weight: 5000 is outside 1..1000", 1},
		{client.FromStatus(status.Error(codes.InvalidArgument, "invalid zone: too long")), "invalid zone: too long", 1},
		{fmt.Errorf("register a/b: %w", client.FromStatus(status.Error(codes.AlreadyExists, "taken"))), "taken", 1},
		{&notFoundError{"orders", "o-1"}, "orders/o-1 not found", 1},
		{status.Error(codes.Unavailable, `connection error: desc = "transport: Error while dialing: dial tcp 127.0.0.1:7400: connect: connection refused"`),
			`cannot reach a regnode at 127.0.0.1:7400: connection error: desc = "transport: Error while dialing: dial tcp 127.0.0.1:7400: connect: connection refused"`, 1},
		{status.Error(codes.Unavailable, "etcdserver: no leader"), "regnode unavailable: etcdserver: no leader", 1},
		{status.Error(codes.DeadlineExceeded, "context deadline exceeded"), "no answer from a regnode at 127.0.0.1:7400 within 2s (--timeout)", 1},
		{context.DeadlineExceeded, "no answer from a regnode at 127.0.0.1:7400 within 2s (--timeout)", 1},
		{errors.New("two\nlines"), "two lines", 1},
		{&usageError{cmd: "regctl get", msg: "bad"}, "bad (see 'regctl get --help')", 2},
	} {
		if got := describe(tc.err, o); got != tc.want {
			t.Errorf("describe(%v) = %q, want %q", tc.err, got, tc.want)
		}
		if got := exitCode(tc.err); got != tc.code {
			t.Errorf("exitCode(%v) = %d, want %d", tc.err, got, tc.code)
		}
	}
}

// runLocal runs regctl in-process for command lines that fail before any
// regnode is contacted.
func runLocal(args ...string) (code int, stdout, stderr string) {
	var out, errb bytes.Buffer
	code = run(context.Background(), args, &out, &errb, func(string) string { return "" })
	return code, out.String(), errb.String()
}

func TestRunUsageErrors(t *testing.T) {
	for _, tc := range []struct {
		args []string
		want string // in the error line
	}{
		{[]string{"bogus"}, `unknown command "bogus"`},
		{[]string{"lst"}, `did you mean "list"`},
		{[]string{"list", "--bogus"}, "unknown flag: --bogus"},
		{[]string{"--timeout", "soon", "list"}, "--timeout"},
		{[]string{"--timeout", "0s", "list"}, "--timeout"},
		{[]string{"-o", "yaml", "list"}, `invalid -o "yaml"`},
		{[]string{"list", "a", "b"}, "at most one argument"},
		{[]string{"list", "Bad_Service"}, "invalid service"},
		{[]string{"get"}, "exactly one argument"},
		{[]string{"get", "orders"}, `"orders" is not SERVICE/ID`},
		{[]string{"get", "orders/a/b"}, "is not SERVICE/ID"},
		{[]string{"drain", "orders/"}, "is not SERVICE/ID"},
		{[]string{"undrain", "ORDERS/x"}, "is not SERVICE/ID"},
		{[]string{"deregister", "a/b", "c/d"}, "exactly one argument"},
		{[]string{"status", "extra"}, "no arguments"},
		{[]string{"services", "extra"}, "no arguments"},
		{[]string{"--endpoints", "nohost", "status"}, `invalid endpoint "nohost"`},
		{[]string{"register", "--id", "i", "--address", "h:1"}, "--service is required"},
		{[]string{"register", "--service", "Bad", "--id", "i", "--address", "h:1"}, "invalid --service"},
		{[]string{"register", "--service", "s", "--id", "i/j", "--address", "h:1"}, "invalid --id"},
		{[]string{"register", "--service", "s", "--id", "i", "--address", "h:1", "--meta", "novalue"}, `invalid --meta "novalue"`},
		{[]string{"register", "--service", "s", "--id", "i", "--address", "h:1", "--check", "http"}, `invalid --check "http"`},
		{[]string{"register", "--service", "s", "--id", "i", "--address", "h:1", "--check-interval", "1s"}, "need --check"},
		{[]string{"register", "--service", "s", "--id", "i", "--address", "h:1", "--weight", "-1"}, `"--weight" flag`},
		// Values the registry refuses are refused here by its rules, before
		// anything is sent, naming the field as the regnode would.
		{reg("--weight", "0"), "--weight: invalid weight: 0 is outside 1..1000"},
		{reg("--weight", "1001"), "invalid weight: 1001 is outside 1..1000"},
		{reg("--weight", "5000"), "invalid weight: 5000 is outside 1..1000"},
		{reg("--ttl", "0s"), "--ttl: invalid ttl: 0s is outside 2s..1h0m0s"},
		{reg("--ttl", "1s"), "invalid ttl"},
		{reg("--ttl", "2h"), "invalid ttl"},
		{reg("--ttl", "2500ms"), "invalid ttl"},
		{[]string{"register", "--service", "s", "--id", "i", "--address", "127.0.0.1:99999"}, "--address: invalid address: port 99999 is out of range 1..65535"},
		{[]string{"register", "--service", "s", "--id", "i", "--address", "nohost"}, "invalid address: not host:port"},
		{[]string{"register", "--service", "s", "--id", "i", "--address", "a b c:80"}, `invalid address: host "a b c"`},
		{[]string{"register", "--service", "s", "--id", "i", "--address", "evil\nhost:80"}, `invalid address: host "evil\nhost"`},
		{[]string{"register", "--service", "s", "--id", "i", "--address", "10.0.0.1:0080"}, "leading zero"},
		{[]string{"--endpoints", "127.0.0.1:99999", "status"}, "port 99999 is out of range 1..65535"},
		{reg("--zone", strings.Repeat("z", 64)), "invalid zone"},
		{reg("--zone", "eu 1"), "--zone: invalid zone"},
		{reg("--version", "1.2\x1b[0m"), "invalid version"},
		{reg("--meta", "a b=v"), `invalid --meta "a b=v"`},
		{reg("--drain-grace", "-1s"), "--drain-grace: invalid drain_grace"},
		{reg("--check", "tcp", "--check-interval", "10ms"), "invalid check.interval"},
		{reg("--check", "tcp", "--check-timeout", "1ns"), "--check-timeout: invalid check.timeout: 1ns is below the 1ms floor"},
		{reg("--check", "tcp", "--check-interval", "1s", "--check-timeout", "2s"), "invalid check.timeout: 2s is longer than the interval 1s"},
		{reg("--check", "grpc:orders v1"), "invalid check.target"},
	} {
		code, stdout, stderr := runLocal(tc.args...)
		if code != exitUsage {
			t.Errorf("%q: exit %d, want %d (stderr %q)", tc.args, code, exitUsage, stderr)
		}
		if stdout != "" {
			t.Errorf("%q: stdout %q, want nothing", tc.args, stdout)
		}
		if !strings.HasPrefix(stderr, "regctl: ") || strings.Count(stderr, "\n") != 1 ||
			!strings.Contains(stderr, tc.want) || !strings.Contains(stderr, "--help')") {
			t.Errorf("%q: stderr %q, want one line with %q and a --help hint", tc.args, stderr, tc.want)
		}
	}
}

// reg is a register command line, valid but for extra.
func reg(extra ...string) []string {
	return append([]string{"register", "--service", "s", "--id", "i", "--address", "h:1"}, extra...)
}

// The boundaries the rules accept pass regctl's own checks: the command
// goes on to register, and fails only for want of a regnode (exit 1, not 2).
func TestRunAcceptsBoundaries(t *testing.T) {
	for _, extra := range [][]string{
		{"--weight", "1"}, {"--weight", "1000"}, {"--ttl", "2s"}, {"--ttl", "1h"},
		{"--zone", strings.Repeat("z", 63)}, {"--meta", strings.Repeat("k", 63) + "=" + strings.Repeat("v", 1024)},
		{"--check", "tcp", "--check-interval", "100ms", "--check-timeout", "1ms"},
		{"--check", "http:/healthz", "--check-interval", "1s", "--check-timeout", "1s"},
	} {
		args := append([]string{"--endpoints", "127.0.0.1:1", "--timeout", "200ms"}, reg(extra...)...)
		code, stdout, stderr := runLocal(args...)
		if code != exitError || stdout != "" || !strings.Contains(stderr, "could not register") {
			t.Errorf("%q: exit %d, stdout %q, stderr %q; want exit 1 for want of a regnode", extra, code, stdout, stderr)
		}
	}
}

func TestRunHelp(t *testing.T) {
	for _, args := range [][]string{nil, {"--help"}, {"list", "--help"}, {"help", "register"}} {
		code, stdout, stderr := runLocal(args...)
		if code != 0 || !strings.Contains(stdout, "Usage:") || stderr != "" {
			t.Errorf("%q: exit %d, stdout %q, stderr %q", args, code, stdout, stderr)
		}
	}
}
