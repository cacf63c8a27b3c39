package record

import (
	"errors"
	"fmt"
	"strings"
	"testing"
	"time"

	"google.golang.org/protobuf/proto"
	"google.golang.org/protobuf/types/known/durationpb"

	registryv1 "github.com/regcluster/registry/proto/registry/v1"
)

// valid is an instance every rule accepts, with every field set.
func valid() *registryv1.Instance {
	return &registryv1.Instance{
		Service: "orders", Id: "o-1", Address: "10.0.0.1:8080", Zone: "eu-1a", Version: "1.2.3",
		Weight: 100, Metadata: map[string]string{"team": "core"},
		Check: &registryv1.HealthCheck{Kind: registryv1.CheckKind_CHECK_KIND_HTTP, Target: "/healthz",
			Interval: durationpb.New(time.Second), Timeout: durationpb.New(500 * time.Millisecond)},
		Lifecycle: registryv1.Lifecycle_LIFECYCLE_SERVING, LifecycleReason: "",
	}
}

// rule is one value of one field: the change to valid(), and the field a
// refusal must name ("" when the value is accepted).
type rule struct {
	name   string
	change func(*registryv1.Instance)
	field  string
}

func ok(name string, change func(*registryv1.Instance)) rule { return rule{name, change, ""} }
func bad(name, field string, change func(*registryv1.Instance)) rule {
	return rule{name, change, field}
}

func meta(n, keyLen, valueLen int) map[string]string {
	m := make(map[string]string, n)
	for i := range n {
		k := fmt.Sprintf("k%d", i)
		if keyLen > len(k) {
			k += strings.Repeat("x", keyLen-len(k))
		}
		m[k] = strings.Repeat("v", valueLen)
	}
	return m
}

func dur(d time.Duration) *durationpb.Duration { return durationpb.New(d) }

func check(kind registryv1.CheckKind, target string) func(*registryv1.Instance) {
	return func(i *registryv1.Instance) { i.Check = &registryv1.HealthCheck{Kind: kind, Target: target} }
}

func checkTimes(interval, timeout *durationpb.Duration) func(*registryv1.Instance) {
	return func(i *registryv1.Instance) { i.Check.Interval, i.Check.Timeout = interval, timeout }
}

const (
	none  = registryv1.CheckKind_CHECK_KIND_NONE
	tcp   = registryv1.CheckKind_CHECK_KIND_TCP
	http  = registryv1.CheckKind_CHECK_KIND_HTTP
	grpcK = registryv1.CheckKind_CHECK_KIND_GRPC
)

func TestValidate(t *testing.T) {
	addr := func(a string) func(*registryv1.Instance) { return func(i *registryv1.Instance) { i.Address = a } }
	label63 := strings.Repeat("a", 63)
	name253 := strings.Join([]string{label63, label63, label63, strings.Repeat("b", 61)}, ".") // 63*3+3+61
	rules := []rule{
		ok("the base instance", func(*registryv1.Instance) {}),

		// service
		ok("service of 1", func(i *registryv1.Instance) { i.Service = "a" }),
		ok("service of 63", func(i *registryv1.Instance) { i.Service = strings.Repeat("s", 63) }),
		ok("service with . and -", func(i *registryv1.Instance) { i.Service = "orders.v1-eu" }),
		bad("service empty", "service", func(i *registryv1.Instance) { i.Service = "" }),
		bad("service of 64", "service", func(i *registryv1.Instance) { i.Service = strings.Repeat("s", 64) }),
		bad("service upper case", "service", func(i *registryv1.Instance) { i.Service = "Orders" }),
		bad("service with _", "service", func(i *registryv1.Instance) { i.Service = "or_ders" }),
		bad("service starting with -", "service", func(i *registryv1.Instance) { i.Service = "-orders" }),
		bad("service ending with .", "service", func(i *registryv1.Instance) { i.Service = "orders." }),

		// id
		ok("id of 128", func(i *registryv1.Instance) { i.Id = strings.Repeat("i", 128) }),
		ok("id of every class", func(i *registryv1.Instance) { i.Id = "A.b_c-9" }),
		bad("id empty", "id", func(i *registryv1.Instance) { i.Id = "" }),
		bad("id of 129", "id", func(i *registryv1.Instance) { i.Id = strings.Repeat("i", 129) }),
		bad("id with /", "id", func(i *registryv1.Instance) { i.Id = "a/b" }),
		bad("id with space", "id", func(i *registryv1.Instance) { i.Id = "a b" }),
		bad("id .", "id", func(i *registryv1.Instance) { i.Id = "." }),
		bad("id ..", "id", func(i *registryv1.Instance) { i.Id = ".." }),

		// address: host
		ok("one-label host", addr("h:1")),
		ok("DNS name", addr("node-2.example.com:7400")),
		ok("DNS name in upper case", addr("Node-2.Example.COM:7400")),
		ok("DNS name with a trailing dot", addr("example.com.:80")),
		ok("DNS name of 253", addr(name253+":80")),
		ok("label of 63", addr(label63+".com:80")),
		ok("label starting with a digit", addr("1password.com:443")),
		ok("IPv4", addr("10.0.0.1:80")),
		ok("IPv6", addr("[::1]:80")),
		ok("IPv6 mapped IPv4", addr("[::ffff:10.0.0.1]:80")),
		ok("IPv6 full", addr("[2001:db8:0:0:0:0:0:1]:80")),
		bad("empty", "address", addr("")),
		bad("no port", "address", addr("h")),
		bad("no host", "address", addr(":80")),
		bad("newline in host", "address", addr("evil\nhost:80")),
		bad("spaces in host", "address", addr("a b c:80")),
		bad("NUL in host", "address", addr("a\x00b:80")),
		bad("underscore in host", "address", addr("a_b:80")),
		bad("non-ASCII host", "address", addr("bücher.de:80")),
		bad("IPv4 octet 300", "address", addr("300.1.1.1:80")),
		bad("IPv4 with a leading zero", "address", addr("10.0.0.01:80")),
		bad("IPv4 of three parts", "address", addr("10.0.1:80")),
		bad("all-digit host", "address", addr("12345:80")),
		bad("IPv4 in brackets", "address", addr("[10.0.0.1]:80")),
		bad("DNS name in brackets", "address", addr("[example.com]:80")),
		bad("IPv6 with a zone", "address", addr("[fe80::1%eth0]:80")),
		bad("IPv6 without brackets", "address", addr("::1:80")),
		bad("empty label", "address", addr("a..b:80")),
		bad("only a dot", "address", addr(".:80")),
		bad("label starting with -", "address", addr("-a.com:80")),
		bad("label ending with -", "address", addr("a-.com:80")),
		bad("label of 64", "address", addr(strings.Repeat("a", 64)+".com:80")),
		bad("DNS name of 254", "address", addr(name253+"b:80")),
		bad("scheme", "address", addr("http://h:80")),
		// address: port
		ok("port 1", addr("h:1")),
		ok("port 65535", addr("h:65535")),
		bad("port 0", "address", addr("h:0")),
		bad("port 65536", "address", addr("h:65536")),
		bad("port 99999", "address", addr("127.0.0.1:99999")),
		bad("port of 20 digits", "address", addr("h:99999999999999999999")),
		bad("port with +", "address", addr("10.0.0.1:+80")),
		bad("port -1", "address", addr("h:-1")),
		bad("port with a leading zero", "address", addr("10.0.0.1:0080")),
		bad("port 00", "address", addr("h:00")),
		bad("port empty", "address", addr("h:")),
		bad("port with a space", "address", addr("h: 80")),
		bad("port with a newline", "address", addr("h:80\n")),
		bad("port in Arabic digits", "address", addr("h:٨٠")),
		bad("port name", "address", addr("h:http")),
		bad("port in hex", "address", addr("h:0x50")),

		// weight
		ok("weight 0 is the default", func(i *registryv1.Instance) { i.Weight = 0 }),
		ok("weight 1", func(i *registryv1.Instance) { i.Weight = 1 }),
		ok("weight 1000", func(i *registryv1.Instance) { i.Weight = 1000 }),
		bad("weight 1001", "weight", func(i *registryv1.Instance) { i.Weight = 1001 }),
		bad("weight max uint32", "weight", func(i *registryv1.Instance) { i.Weight = 1<<32 - 1 }),

		// zone and version: names
		ok("zone empty", func(i *registryv1.Instance) { i.Zone = "" }),
		ok("zone of 63", func(i *registryv1.Instance) { i.Zone = strings.Repeat("z", 63) }),
		ok("zone of 63 non-ASCII characters", func(i *registryv1.Instance) { i.Zone = strings.Repeat("ö", 63) }),
		ok("zone with punctuation", func(i *registryv1.Instance) { i.Zone = "eu-west-1a/rack_7:b" }),
		bad("zone of 64", "zone", func(i *registryv1.Instance) { i.Zone = strings.Repeat("z", 64) }),
		bad("zone with a space", "zone", func(i *registryv1.Instance) { i.Zone = "eu 1" }),
		bad("zone with a newline", "zone", func(i *registryv1.Instance) { i.Zone = "eu\n1" }),
		bad("zone with NUL", "zone", func(i *registryv1.Instance) { i.Zone = "eu\x00" }),
		bad("zone with ESC", "zone", func(i *registryv1.Instance) { i.Zone = "\x1b[2J" }),
		bad("zone with DEL", "zone", func(i *registryv1.Instance) { i.Zone = "eu\x7f" }),
		bad("zone with a no-break space", "zone", func(i *registryv1.Instance) { i.Zone = "eu\u00a01" }),
		bad("zone with a C1 control", "zone", func(i *registryv1.Instance) { i.Zone = "eu\u0085" }),
		bad("zone not UTF-8", "zone", func(i *registryv1.Instance) { i.Zone = "eu\xff" }),
		ok("version of 128", func(i *registryv1.Instance) { i.Version = strings.Repeat("v", 128) }),
		ok("version semver", func(i *registryv1.Instance) { i.Version = "v1.2.3-rc.1+build.5" }),
		bad("version of 129", "version", func(i *registryv1.Instance) { i.Version = strings.Repeat("v", 129) }),
		bad("version with a space", "version", func(i *registryv1.Instance) { i.Version = "1.2 3" }),
		bad("version with a tab", "version", func(i *registryv1.Instance) { i.Version = "1.2\t3" }),
		bad("version not UTF-8", "version", func(i *registryv1.Instance) { i.Version = "\xc3" }),

		// metadata
		ok("no metadata", func(i *registryv1.Instance) { i.Metadata = nil }),
		ok("64 entries", func(i *registryv1.Instance) { i.Metadata = meta(64, 0, 8) }),
		bad("65 entries", "metadata", func(i *registryv1.Instance) { i.Metadata = meta(65, 0, 8) }),
		ok("key of 63", func(i *registryv1.Instance) { i.Metadata = meta(1, 63, 1) }),
		ok("key of 63 non-ASCII characters", func(i *registryv1.Instance) { i.Metadata = map[string]string{strings.Repeat("ü", 63): "v"} }),
		bad("key of 64", "metadata", func(i *registryv1.Instance) { i.Metadata = meta(1, 64, 1) }),
		ok("key with punctuation", func(i *registryv1.Instance) { i.Metadata = map[string]string{"app.kubernetes.io/name": "x"} }),
		bad("empty key", "metadata", func(i *registryv1.Instance) { i.Metadata = map[string]string{"": "v"} }),
		bad("key with a space", "metadata", func(i *registryv1.Instance) { i.Metadata = map[string]string{"a b": "v"} }),
		bad("key with a newline", "metadata", func(i *registryv1.Instance) { i.Metadata = map[string]string{"a\nb": "v"} }),
		bad("key with a control character", "metadata", func(i *registryv1.Instance) { i.Metadata = map[string]string{"a\x01": "v"} }),
		bad("key not UTF-8", "metadata", func(i *registryv1.Instance) { i.Metadata = map[string]string{"\xff": "v"} }),
		ok("value of 1 KiB", func(i *registryv1.Instance) { i.Metadata = meta(1, 0, 1024) }),
		bad("value of 1 KiB + 1", "metadata", func(i *registryv1.Instance) { i.Metadata = meta(1, 0, 1025) }),
		ok("empty value", func(i *registryv1.Instance) { i.Metadata = map[string]string{"k": ""} }),
		ok("value with spaces and non-ASCII", func(i *registryv1.Instance) { i.Metadata = map[string]string{"k": "eine schöne Grüße ✓"} }),
		bad("value with a newline", "metadata", func(i *registryv1.Instance) { i.Metadata = map[string]string{"k": "a\nb"} }),
		bad("value with a tab", "metadata", func(i *registryv1.Instance) { i.Metadata = map[string]string{"k": "a\tb"} }),
		bad("value with ESC", "metadata", func(i *registryv1.Instance) { i.Metadata = map[string]string{"k": "\x1b[31mred"} }),
		bad("value with DEL", "metadata", func(i *registryv1.Instance) { i.Metadata = map[string]string{"k": "\x7f"} }),
		bad("value with a C1 control", "metadata", func(i *registryv1.Instance) { i.Metadata = map[string]string{"k": "\u009b"} }),
		bad("value not UTF-8", "metadata", func(i *registryv1.Instance) { i.Metadata = map[string]string{"k": "\xe2\x82"} }),

		// lifecycle
		ok("lifecycle unspecified", func(i *registryv1.Instance) { i.Lifecycle = 0 }),
		ok("lifecycle draining", func(i *registryv1.Instance) { i.Lifecycle = registryv1.Lifecycle_LIFECYCLE_DRAINING }),
		bad("lifecycle 4", "lifecycle", func(i *registryv1.Instance) { i.Lifecycle = 4 }),
		bad("lifecycle -1", "lifecycle", func(i *registryv1.Instance) { i.Lifecycle = -1 }),
		ok("reason of 1 KiB", func(i *registryv1.Instance) { i.LifecycleReason = strings.Repeat("r", 1024) }),
		ok("reason with spaces", func(i *registryv1.Instance) { i.LifecycleReason = "kernel upgrade" }),
		bad("reason of 1 KiB + 1", "lifecycle_reason", func(i *registryv1.Instance) { i.LifecycleReason = strings.Repeat("r", 1025) }),
		bad("reason with a newline", "lifecycle_reason", func(i *registryv1.Instance) { i.LifecycleReason = "a\nlevel=error msg=forged" }),
		bad("reason not UTF-8", "lifecycle_reason", func(i *registryv1.Instance) { i.LifecycleReason = "\xff" }),

		// check kind and target
		ok("no check", func(i *registryv1.Instance) { i.Check = nil }),
		ok("NONE without a target", check(none, "")),
		bad("NONE with a target", "check.target", check(none, "/healthz")),
		ok("TCP without a target", check(tcp, "")),
		bad("TCP with a target", "check.target", check(tcp, "10.0.0.1:81")),
		ok("HTTP with a path", check(http, "/healthz?full=1")),
		ok("HTTP with a path of 1 KiB", check(http, "/"+strings.Repeat("p", 1023))),
		bad("HTTP with a path of 1 KiB + 1", "check.target", check(http, "/"+strings.Repeat("p", 1024))),
		bad("HTTP without a path", "check.target", check(http, "")),
		bad("HTTP with a relative path", "check.target", check(http, "healthz")),
		bad("HTTP with a space in the path", "check.target", check(http, "/health z")),
		bad("HTTP with a newline in the path", "check.target", check(http, "/healthz\r\nX-Evil: 1")),
		ok("GRPC without a service", check(grpcK, "")),
		ok("GRPC with a service", check(grpcK, "orders.v1.Orders")),
		bad("GRPC with a space", "check.target", check(grpcK, "orders v1")),
		bad("GRPC not UTF-8", "check.target", check(grpcK, "\xff")),
		bad("kind 4", "check.kind", check(4, "")),
		bad("kind -1", "check.kind", check(-1, "")),

		// check durations
		ok("interval and timeout unset", checkTimes(nil, nil)),
		ok("interval 0 and timeout 0 mean the defaults", checkTimes(dur(0), dur(0))),
		ok("interval 100ms", checkTimes(dur(100*time.Millisecond), nil)),
		ok("interval 1h", checkTimes(dur(time.Hour), nil)),
		bad("interval 99ms", "check.interval", checkTimes(dur(99*time.Millisecond), nil)),
		bad("interval 1ns", "check.interval", checkTimes(dur(1), nil)),
		bad("interval 1h + 1ns", "check.interval", checkTimes(dur(time.Hour+1), nil)),
		bad("interval -1s", "check.interval", checkTimes(dur(-time.Second), nil)),
		bad("interval not a valid duration", "check.interval", checkTimes(&durationpb.Duration{Seconds: 1, Nanos: -1}, nil)),
		ok("timeout 1ms", checkTimes(nil, dur(time.Millisecond))),
		ok("timeout equal to the interval", checkTimes(dur(time.Second), dur(time.Second))),
		ok("timeout without an interval", checkTimes(nil, dur(30*time.Second))),
		bad("timeout 1ns", "check.timeout", checkTimes(nil, dur(1))),
		bad("timeout 999µs", "check.timeout", checkTimes(nil, dur(999*time.Microsecond))),
		bad("timeout longer than the interval", "check.timeout", checkTimes(dur(time.Second), dur(time.Second+1))),
		bad("timeout -1ms", "check.timeout", checkTimes(nil, dur(-time.Millisecond))),
		bad("timeout over 1h", "check.timeout", checkTimes(nil, dur(2*time.Hour))),
		ok("slow threshold 1h", func(i *registryv1.Instance) { i.Check.SlowThreshold = dur(time.Hour) }),
		bad("slow threshold 1h + 1ns", "check.slow_threshold", func(i *registryv1.Instance) { i.Check.SlowThreshold = dur(time.Hour + 1) }),
		bad("slow threshold -1ns", "check.slow_threshold", func(i *registryv1.Instance) { i.Check.SlowThreshold = dur(-1) }),

		// check thresholds
		ok("thresholds of 100", func(i *registryv1.Instance) {
			c := i.Check
			c.FailuresToDegraded, c.FailuresToUnavailable, c.SuccessesToHealthy, c.SuccessesToDegraded = 100, 100, 100, 100
		}),
		bad("failures_to_degraded 101", "check.failures_to_degraded", func(i *registryv1.Instance) { i.Check.FailuresToDegraded = 101 }),
		bad("failures_to_unavailable 101", "check.failures_to_unavailable", func(i *registryv1.Instance) { i.Check.FailuresToUnavailable = 101 }),
		bad("successes_to_healthy 101", "check.successes_to_healthy", func(i *registryv1.Instance) { i.Check.SuccessesToHealthy = 101 }),
		bad("successes_to_degraded 101", "check.successes_to_degraded", func(i *registryv1.Instance) { i.Check.SuccessesToDegraded = 101 }),

		// fields of a stored record: only what encoding needs
		ok("health reason with newlines", func(i *registryv1.Instance) {
			i.Health = &registryv1.Health{Reason: "dial tcp: connection refused\nretrying", Observer: "n1"}
		}),
		bad("health reason not UTF-8", "health.reason", func(i *registryv1.Instance) { i.Health = &registryv1.Health{Reason: "\xff"} }),
		bad("health observer not UTF-8", "health.observer", func(i *registryv1.Instance) { i.Health = &registryv1.Health{Observer: "\xff"} }),
		bad("incarnation not UTF-8", "incarnation", func(i *registryv1.Instance) { i.Incarnation = "\xff" }),
	}
	for _, r := range rules {
		t.Run(r.name, func(t *testing.T) {
			in := valid()
			r.change(in)
			expect(t, in, r.field)
		})
	}
}

// expect checks that Validate accepts in (field "") or refuses it naming
// field, and that what it accepts encodes and decodes back.
func expect(t *testing.T, in *registryv1.Instance, field string) {
	t.Helper()
	err := Validate(in)
	if field == "" {
		if err != nil {
			t.Fatalf("Validate = %v, want nil", err)
		}
		b, err := Encode(in)
		if err != nil {
			t.Fatalf("an instance Validate accepts does not encode: %v", err)
		}
		if _, err := NewKeys("").Decode(NewKeys("").Instance(in.Service, in.Id), b, 1, 2); err != nil {
			t.Fatalf("an instance Validate accepts does not decode: %v", err)
		}
		return
	}
	var fe *FieldError
	if !errors.As(err, &fe) || fe.Field != field || !errors.Is(err, ErrInvalid) {
		t.Fatalf("Validate = %v, want a FieldError naming %q", err, field)
	}
	if want := "invalid " + field + ": "; !strings.HasPrefix(err.Error(), want) || fe.Reason == "" {
		t.Fatalf("message %q does not start %q with a reason", err, want)
	}
	// A refusal quotes what it refuses: the message stays one line, so it
	// cannot forge a log line.
	if strings.ContainsAny(err.Error(), "\n\r\x00\x1b") {
		t.Fatalf("message %q carries a control character", err)
	}
}

// The reason of a refused address says what is wrong with it.
func TestValidAddressReasons(t *testing.T) {
	for address, want := range map[string]string{
		"127.0.0.1:99999":        "port 99999 is out of range 1..65535",
		"h:99999999999999999999": "port 99999999999999999999 is out of range 1..65535",
		"h:0":                    "port 0 is out of range 1..65535",
		"10.0.0.1:+80":           `port "+80" is not a decimal number`,
		"10.0.0.1:0080":          `port "0080" has a leading zero`,
		"h:":                     "port is missing",
		":80":                    "no host",
		"nohost":                 "not host:port (missing port in address)",
		"::1:80":                 "not host:port (too many colons in address)",
		"300.1.1.1:80":           `host "300.1.1.1" is neither an IP address nor a DNS name: the last label is all digits`,
		"a b c:80":               `host "a b c" is neither an IP address nor a DNS name: only letters, digits`,
		"evil\nhost:80":          `host "evil\nhost"`,
		"a..b:80":                "empty label",
		"-a:80":                  "starts or ends with '-'",
		"[10.0.0.1]:80":          `host "[10.0.0.1]": only an IPv6 address without a zone goes in brackets`,
		"":                       "must not be empty",
	} {
		err := ValidAddress(address)
		var fe *FieldError
		if !errors.As(err, &fe) || fe.Field != "address" || !strings.Contains(fe.Reason, want) {
			t.Errorf("ValidAddress(%q) = %v, want a reason with %q", address, err, want)
		}
	}
}

func TestValidateNil(t *testing.T) {
	var fe *FieldError
	if err := Validate(nil); !errors.As(err, &fe) || fe.Field != "instance" {
		t.Fatalf("Validate(nil) = %v", err)
	}
}

// The whole record: 16 KiB exactly is accepted, one byte more refused.
func TestValidateRecordSize(t *testing.T) {
	in := valid()
	in.Metadata = meta(15, 0, MaxMetaValueLen)
	in.Metadata["pad"] = ""
	base := proto.Size(in)
	if base >= MaxRecordSize || MaxRecordSize-base > MaxMetaValueLen {
		t.Fatalf("the base record is %d bytes: cannot pad it to %d with one value", base, MaxRecordSize)
	}
	// Once the padding's length takes two varint bytes (>= 128), every
	// byte more in the value is one byte more in the record.
	for n := 128; n <= MaxMetaValueLen; n++ {
		in.Metadata["pad"] = strings.Repeat("p", n)
		if proto.Size(in) == MaxRecordSize {
			break
		}
	}
	if got := proto.Size(in); got != MaxRecordSize {
		t.Fatalf("could not build a record of exactly %d bytes (got %d)", MaxRecordSize, got)
	}
	expect(t, in, "")
	in.Metadata["pad"] += "p"
	if got := proto.Size(in); got != MaxRecordSize+1 {
		t.Fatalf("record is %d bytes, want %d", got, MaxRecordSize+1)
	}
	expect(t, in, "instance")
}

func TestValidTTL(t *testing.T) {
	for _, tc := range []struct {
		ttl time.Duration
		ok  bool
	}{
		{0, true}, {MinTTL, true}, {MaxTTL, true}, {DefaultTTL, true}, {time.Minute, true},
		{time.Second, false}, {MinTTL - 1, false}, {MaxTTL + time.Second, false}, {MaxTTL + 1, false},
		{2500 * time.Millisecond, false}, {-MinTTL, false},
	} {
		err := ValidTTL(tc.ttl)
		var fe *FieldError
		if tc.ok != (err == nil) || !tc.ok && (!errors.As(err, &fe) || fe.Field != "ttl") {
			t.Errorf("ValidTTL(%s) = %v, want ok %v", tc.ttl, err, tc.ok)
		}
	}
}

func TestValidReasonAndMetadata(t *testing.T) {
	// The exported checks regctl and the server use alone agree with
	// Validate's.
	if err := ValidReason("kernel upgrade"); err != nil {
		t.Errorf("ValidReason = %v", err)
	}
	if err := ValidReason("a\x00"); err == nil {
		t.Errorf("ValidReason accepted a NUL")
	}
	if err := ValidMetadata("az", "eu-1a"); err != nil {
		t.Errorf("ValidMetadata = %v", err)
	}
	if err := ValidMetadata("a z", "eu-1a"); err == nil {
		t.Errorf("ValidMetadata accepted a key with a space")
	}
}

func TestNormalizeAndEffectiveWeight(t *testing.T) {
	in := &registryv1.Instance{}
	Normalize(in)
	if in.Weight != DefaultWeight || in.Lifecycle != registryv1.Lifecycle_LIFECYCLE_SERVING {
		t.Fatalf("Normalize = %v", in)
	}
	in = &registryv1.Instance{Weight: 7, Lifecycle: registryv1.Lifecycle_LIFECYCLE_DRAINING}
	Normalize(in)
	if in.Weight != 7 || in.Lifecycle != registryv1.Lifecycle_LIFECYCLE_DRAINING {
		t.Fatalf("Normalize overwrote set fields: %v", in)
	}
	degraded := &registryv1.Health{State: registryv1.HealthState_HEALTH_STATE_DEGRADED}
	for _, tc := range []struct {
		weight uint32
		health *registryv1.Health
		want   uint32
	}{
		{0, nil, DefaultWeight}, {8, nil, 8}, {8, degraded, 2}, {3, degraded, 1}, {0, degraded, DefaultWeight / 4},
	} {
		if got := EffectiveWeight(&registryv1.Instance{Weight: tc.weight, Health: tc.health}); got != tc.want {
			t.Errorf("EffectiveWeight(%d, %v) = %d, want %d", tc.weight, tc.health.GetState(), got, tc.want)
		}
	}
}
