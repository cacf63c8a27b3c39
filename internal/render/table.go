package render

import (
	"fmt"
	"io"
	"sort"
	"strconv"
	"strings"
	"text/tabwriter"
	"time"
	"unicode"
	"unicode/utf8"
)

// Table writes rows of cells aligned in columns (text/tabwriter, two spaces
// between columns). Cells go through Cell, so an empty cell shows as "-"
// and a tab or newline in a value cannot break the alignment.
type Table struct {
	tw *tabwriter.Writer
}

// NewTable starts a table on w; header, if any, is its first row.
func NewTable(w io.Writer, header ...string) *Table {
	t := &Table{tw: tabwriter.NewWriter(w, 0, 8, 2, ' ', 0)}
	if len(header) > 0 {
		t.Row(header...)
	}
	return t
}

// Row adds one row.
func (t *Table) Row(cells ...string) {
	out := make([]string, len(cells))
	for i, c := range cells {
		out[i] = Cell(c)
	}
	t.rawRow(out...)
}

// rawRow adds one row of cells already escaped.
func (t *Table) rawRow(cells ...string) {
	io.WriteString(t.tw, strings.Join(cells, "\t")+"\n")
}

// Flush writes the aligned table; call it once, after the last row.
func (t *Table) Flush() error { return t.tw.Flush() }

// Cell is s as a table shows it: "-" when empty, control and other
// non-printable characters escaped as in a Go string literal ("\t", "\n",
// "\x00").
func Cell(s string) string {
	if s == "" {
		return "-"
	}
	return escape(s)
}

// escape escapes the non-printable characters of s as in a Go string
// literal.
func escape(s string) string {
	clean := true
	for _, r := range s {
		if r == utf8.RuneError || !unicode.IsGraphic(r) {
			clean = false
			break
		}
	}
	if clean {
		return s
	}
	var b strings.Builder
	for i, r := range s {
		if r == utf8.RuneError {
			fmt.Fprintf(&b, `\x%02x`, s[i])
			continue
		}
		if !unicode.IsGraphic(r) {
			q := strconv.QuoteRune(r)
			b.WriteString(q[1 : len(q)-1])
			continue
		}
		b.WriteRune(r)
	}
	return b.String()
}

// Age is a duration as a short human age: the two most significant units
// of days, hours, minutes and seconds, dropping a zero second unit ("45s",
// "3m12s", "5h", "2d4h"). Negative durations (clock skew) show as "0s".
func Age(d time.Duration) string {
	if d < time.Second {
		return "0s"
	}
	s := int64(d / time.Second)
	days, s := s/86400, s%86400
	hours, s := s/3600, s%3600
	mins, secs := s/60, s%60
	two := func(a int64, au string, b int64, bu string) string {
		if b == 0 {
			return fmt.Sprintf("%d%s", a, au)
		}
		return fmt.Sprintf("%d%s%d%s", a, au, b, bu)
	}
	switch {
	case days > 0:
		return two(days, "d", hours, "h")
	case hours > 0:
		return two(hours, "h", mins, "m")
	case mins > 0:
		return two(mins, "m", secs, "s")
	}
	return fmt.Sprintf("%ds", secs)
}

// ageSince is the age of t at now, "-" when t is unknown.
func ageSince(t, now time.Time) string {
	if t.IsZero() {
		return "-"
	}
	return Age(now.Sub(t))
}

// MetadataString is md as sorted, comma-separated key=value pairs.
func MetadataString(md map[string]string) string {
	keys := make([]string, 0, len(md))
	for k := range md {
		keys = append(keys, k)
	}
	sort.Strings(keys)
	parts := make([]string, 0, len(keys))
	for _, k := range keys {
		parts = append(parts, k+"="+md[k])
	}
	return strings.Join(parts, ",")
}

// String describes the check for people: "none", "tcp", "http /healthz",
// "grpc orders.v1.Orders", followed by any interval and timeout
// ("tcp every 1s, timeout 500ms").
func (c Check) String() string {
	kind := strings.ToLower(c.Kind)
	if kind == "" || kind == "none" {
		return "none"
	}
	s := kind
	if c.Target != "" {
		s += " " + c.Target
	}
	if c.Interval != "" {
		s += " every " + c.Interval
	}
	if c.Timeout != "" {
		s += ", timeout " + c.Timeout
	}
	return s
}

// reason is the REASON column: the lifecycle reason and the health reason,
// whichever are set.
func (i Instance) reason() string {
	var parts []string
	if i.LifecycleReason != "" {
		parts = append(parts, i.LifecycleReason)
	}
	if i.Health.Reason != "" {
		parts = append(parts, i.Health.Reason)
	}
	return strings.Join(parts, "; ")
}

// WriteInstances writes insts as a table: SERVICE ID ADDRESS ZONE WEIGHT
// LIFECYCLE HEALTH SINCE, and when wide also VERSION LEASE MOD_REV REASON
// METADATA. SINCE is the age at now of Instance.Since. With no instances it
// writes "No instances found." instead.
func WriteInstances(w io.Writer, insts []Instance, wide bool, now time.Time) error {
	if len(insts) == 0 {
		_, err := io.WriteString(w, "No instances found.\n")
		return err
	}
	header := []string{"SERVICE", "ID", "ADDRESS", "ZONE", "WEIGHT", "LIFECYCLE", "HEALTH", "SINCE"}
	if wide {
		header = append(header, "VERSION", "LEASE", "MOD_REV", "REASON", "METADATA")
	}
	t := NewTable(w, header...)
	for _, i := range insts {
		row := []string{i.Service, i.ID, i.Address, i.Zone, strconv.FormatUint(uint64(i.Weight), 10),
			i.Lifecycle, i.Health.State, ageSince(i.Since(), now)}
		if wide {
			row = append(row, i.Version, i.LeaseID, strconv.FormatInt(i.ModRevision, 10), i.reason(), MetadataString(i.Metadata))
		}
		t.Row(row...)
	}
	return t.Flush()
}

// WriteInstance writes one instance as a "Key: value" block, every field
// included, times both as RFC 3339 and as an age at now.
func WriteInstance(w io.Writer, i Instance, now time.Time) error {
	t := NewTable(w)
	kv := func(k, v string) { t.Row(k+":", v) }
	when := func(ts time.Time) string {
		if ts.IsZero() {
			return ""
		}
		return fmt.Sprintf("%s (%s ago)", ts.Format(time.RFC3339Nano), Age(now.Sub(ts)))
	}
	kv("Service", i.Service)
	kv("ID", i.ID)
	kv("Address", i.Address)
	kv("Zone", i.Zone)
	kv("Version", i.Version)
	kv("Weight", strconv.FormatUint(uint64(i.Weight), 10))
	kv("Lifecycle", i.Lifecycle)
	kv("Lifecycle reason", i.LifecycleReason)
	kv("Health", i.Health.State)
	kv("Health since", when(i.Health.Since))
	kv("Health reason", i.Health.Reason)
	latency := ""
	if i.Health.LatencyMS > 0 {
		latency = time.Duration(i.Health.LatencyMS * float64(time.Millisecond)).Round(time.Microsecond).String()
	}
	kv("Last probe latency", latency)
	observer := i.Health.Observer
	if observer != "" && i.Health.Fence != 0 {
		observer += fmt.Sprintf(" (fence %d)", i.Health.Fence)
	}
	kv("Observed by", observer)
	kv("Check", i.Check.String())
	if len(i.Metadata) == 0 {
		kv("Metadata", "")
	} else {
		keys := make([]string, 0, len(i.Metadata))
		for k := range i.Metadata {
			keys = append(keys, k)
		}
		sort.Strings(keys)
		for n, k := range keys {
			label := "Metadata:"
			if n > 0 {
				label = ""
			}
			t.rawRow(label, escape(k)+"="+escape(i.Metadata[k]))
		}
	}
	kv("Lease", i.LeaseID)
	kv("Registered", when(i.RegisteredAt))
	kv("Mod revision", strconv.FormatInt(i.ModRevision, 10))
	kv("Create revision", strconv.FormatInt(i.CreateRevision, 10))
	kv("Incarnation", i.Incarnation)
	return t.Flush()
}

// WriteServices writes per-service counts as a table: SERVICE TOTAL SERVING
// DRAINING HEALTHY DEGRADED UNAVAILABLE UNKNOWN, and when wide also
// STARTING. With no services it writes "No services found." instead.
func WriteServices(w io.Writer, counts []ServiceCounts, wide bool) error {
	if len(counts) == 0 {
		_, err := io.WriteString(w, "No services found.\n")
		return err
	}
	header := []string{"SERVICE", "TOTAL", "SERVING", "DRAINING", "HEALTHY", "DEGRADED", "UNAVAILABLE", "UNKNOWN"}
	if wide {
		header = append(header, "STARTING")
	}
	t := NewTable(w, header...)
	for _, c := range counts {
		row := []string{c.Service, num(c.Total), num(c.Serving), num(c.Draining), num(c.Healthy),
			num(c.Degraded), num(c.Unavailable), num(c.Unknown)}
		if wide {
			row = append(row, num(c.Starting))
		}
		t.Row(row...)
	}
	return t.Flush()
}

// WriteStatus writes a regnode's status: a "Key: value" block (node,
// prober leader, revisions, cluster id, etcd version), the members table
// (NAME ID CLIENT_URLS LEADER, and when wide also PEER_URLS LEARNER) and
// the instance counts, then each regnode's prober (PROBER ADDRESS ZONE
// OWNED PROBES/S DISAGREEMENTS HELD CANARIES).
func WriteStatus(w io.Writer, s Status, wide bool) error {
	t := NewTable(w)
	kv := func(k, v string) { t.Row(k+":", v) }
	kv("Node", s.Node)
	kv("Prober leader", s.Leader)
	kv("Revision", num(s.Revision))
	kv("Compact revision", num(s.CompactRevision))
	kv("Cluster ID", s.ClusterID)
	kv("Epoch", s.Epoch)
	kv("etcd version", s.EtcdVersion)
	kv("Embedded etcd", yesNo(s.Embedded))
	kv("Junk skipped", num(s.JunkSkipped))
	if s.Version != "" {
		kv("regnode version", s.Version)
	}
	if err := t.Flush(); err != nil {
		return err
	}
	io.WriteString(w, "\n")
	header := []string{"MEMBER", "ID", "CLIENT_URLS", "LEADER"}
	if wide {
		header = append(header, "PEER_URLS", "LEARNER")
	}
	t = NewTable(w, header...)
	for _, m := range s.Members {
		row := []string{m.Name, m.ID, strings.Join(m.ClientURLs, ","), yesNo(m.IsLeader)}
		if wide {
			row = append(row, strings.Join(m.PeerURLs, ","), yesNo(m.IsLearner))
		}
		t.Row(row...)
	}
	if err := t.Flush(); err != nil {
		return err
	}
	io.WriteString(w, "\n")
	c := s.Counts
	t = NewTable(w, "INSTANCES", "SERVICES", "STARTING", "SERVING", "DRAINING", "HEALTHY", "DEGRADED", "UNAVAILABLE", "UNKNOWN")
	t.Row(num(c.Total), num(c.Services), num(c.Starting), num(c.Serving), num(c.Draining),
		num(c.Healthy), num(c.Degraded), num(c.Unavailable), num(c.Unknown))
	if err := t.Flush(); err != nil {
		return err
	}
	if len(s.Probing) == 0 {
		return nil
	}
	io.WriteString(w, "\n")
	t = NewTable(w, "PROBER", "ADDRESS", "ZONE", "OWNED", "PROBES/S", "DISAGREEMENTS", "HELD", "CANARIES")
	for _, p := range s.Probing {
		if p.Error != "" {
			t.Row(p.Node, p.Address, "-", "-", "-", "-", "-", "not asked: "+p.Error)
			continue
		}
		canary := "pass"
		if p.Canary != "" {
			canary = "FAIL: " + p.Canary
		}
		t.Row(p.Node, p.Address, dash(p.Zone), num(p.Owned), strconv.FormatFloat(p.ProbesPerSecond, 'f', 1, 64),
			strconv.FormatUint(p.Disagreements, 10), strconv.FormatUint(p.Held, 10), canary)
	}
	return t.Flush()
}

func dash(s string) string {
	if s == "" {
		return "-"
	}
	return s
}

func num(n int64) string { return strconv.FormatInt(n, 10) }

func yesNo(b bool) string {
	if b {
		return "yes"
	}
	return "no"
}
