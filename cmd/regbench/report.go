package main

import (
	"bytes"
	"encoding/json"
	"fmt"
	"io"
	"math"
	"strings"
	"text/tabwriter"
)

// omap is a JSON object that keeps its keys in insertion order, so that the
// JSON and the table read in the order the scenario measured things.
type omap struct {
	keys []string
	vals map[string]any
}

func newOmap() *omap { return &omap{vals: map[string]any{}} }

func (m *omap) set(k string, v any) *omap {
	if _, ok := m.vals[k]; !ok {
		m.keys = append(m.keys, k)
	}
	m.vals[k] = v
	return m
}

func (m *omap) get(k string) (any, bool) {
	v, ok := m.vals[k]
	return v, ok
}

// sub returns the object under k, creating it.
func (m *omap) sub(k string) *omap {
	if v, ok := m.vals[k].(*omap); ok {
		return v
	}
	s := newOmap()
	m.set(k, s)
	return s
}

func (m *omap) MarshalJSON() ([]byte, error) {
	var b bytes.Buffer
	b.WriteByte('{')
	for i, k := range m.keys {
		if i > 0 {
			b.WriteByte(',')
		}
		kb, _ := json.Marshal(k)
		b.Write(kb)
		b.WriteByte(':')
		vb, err := json.Marshal(m.vals[k])
		if err != nil {
			return nil, fmt.Errorf("%s: %w", k, err)
		}
		b.Write(vb)
	}
	b.WriteByte('}')
	return b.Bytes(), nil
}

// Lat is a latency distribution in milliseconds.
type Lat struct {
	P50, P99, Max float64
	N             int
}

func (l Lat) MarshalJSON() ([]byte, error) {
	return json.Marshal(map[string]any{"p50": round3(l.P50), "p99": round3(l.P99), "max": round3(l.Max), "n": l.N})
}

func round3(x float64) float64 {
	if math.IsNaN(x) || math.IsInf(x, 0) {
		return 0
	}
	return math.Round(x*1000) / 1000
}

// Target is one of the targets, checked against what was measured.
type Target struct {
	Name string `json:"name"`
	Want string `json:"want"`
	Got  string `json:"got"`
	Met  bool   `json:"met"`
}

// Result is what one scenario measured: ours against its baseline(s), case
// by case (a case is one setting of the scenario's parameter: a
// concurrency, a number of subscribers...).
type Result struct {
	Scenario string   `json:"scenario"`
	Params   *omap    `json:"params"`
	Ours     *omap    `json:"ours"`     // case → metric → value
	Baseline *omap    `json:"baseline"` // baseline → case → metric → value
	Ratio    *omap    `json:"ratio"`    // baseline → case → metric → ours/baseline
	Targets  []Target `json:"targets"`
	Notes    []string `json:"notes,omitempty"`
	Error    string   `json:"error,omitempty"`
	Seconds  float64  `json:"seconds"`

	title   string   // one line on what is compared, for the table
	noRatio []string // metrics that get no ratio (counts, not figures of merit)
	cases   []string // in order of first use
	bases   []string // in order of first use
}

func newResult(scenario, title string) *Result {
	return &Result{Scenario: scenario, title: title, Params: newOmap(), Ours: newOmap(),
		Baseline: newOmap(), Ratio: newOmap(), Targets: []Target{}}
}

func (r *Result) param(k string, v any) { r.Params.set(k, v) }

func (r *Result) addCase(c string) {
	for _, x := range r.cases {
		if x == c {
			return
		}
	}
	r.cases = append(r.cases, c)
}

func (r *Result) addBase(b string) {
	for _, x := range r.bases {
		if x == b {
			return
		}
	}
	r.bases = append(r.bases, b)
}

// ours records a metric of ours in case c.
func (r *Result) ours(c, metric string, v any) {
	r.addCase(c)
	r.Ours.sub(c).set(metric, v)
}

// base records a metric of baseline b in case c.
func (r *Result) base(b, c, metric string, v any) {
	r.addCase(c)
	r.addBase(b)
	r.Baseline.sub(b).sub(c).set(metric, v)
}

func (r *Result) note(format string, args ...any) {
	r.Notes = append(r.Notes, fmt.Sprintf(format, args...))
}

func (r *Result) target(name, want, got string, met bool) {
	r.Targets = append(r.Targets, Target{Name: name, Want: want, Got: got, Met: met})
}

// skipRatio marks metrics whose ratio means nothing (e.g. sample counts).
func (r *Result) skipRatio(metrics ...string) { r.noRatio = append(r.noRatio, metrics...) }

func (r *Result) ratioSkipped(m string) bool {
	for _, x := range r.noRatio {
		if x == m {
			return true
		}
	}
	return m == "n"
}

// finish computes ours/baseline for every metric both have.
func (r *Result) finish() {
	for _, b := range r.bases {
		bm, _ := r.Baseline.get(b)
		for _, c := range r.cases {
			bc, ok := bm.(*omap).get(c)
			if !ok {
				continue
			}
			oc, ok := r.Ours.get(c)
			if !ok {
				continue
			}
			for _, metric := range bc.(*omap).keys {
				if r.ratioSkipped(metric) {
					continue
				}
				ov, ok := oc.(*omap).get(metric)
				if !ok {
					continue
				}
				bv, _ := bc.(*omap).get(metric)
				if q, ok := ratioOf(ov, bv); ok {
					r.Ratio.sub(b).sub(c).set(metric, q)
				}
			}
		}
	}
}

func num(v any) (float64, bool) {
	switch x := v.(type) {
	case float64:
		return x, true
	case int:
		return float64(x), true
	case int64:
		return float64(x), true
	}
	return 0, false
}

func ratioOf(o, b any) (any, bool) {
	if ol, ok := o.(Lat); ok {
		bl, ok := b.(Lat)
		if !ok || ol.N == 0 || bl.N == 0 {
			return nil, false
		}
		q := newOmap()
		for _, p := range []struct {
			k    string
			o, b float64
		}{{"p50", ol.P50, bl.P50}, {"p99", ol.P99, bl.P99}, {"max", ol.Max, bl.Max}} {
			if p.b > 0 {
				q.set(p.k, round3(p.o/p.b))
			}
		}
		return q, len(q.keys) > 0
	}
	of, ok1 := num(o)
	bf, ok2 := num(b)
	if !ok1 || !ok2 || bf == 0 {
		return nil, false
	}
	return round3(of / bf), true
}

// writeJSON prints r as one line of JSON.
func (r *Result) writeJSON(w io.Writer) error {
	b, err := json.Marshal(r)
	if err != nil {
		return err
	}
	b = append(b, '\n')
	_, err = w.Write(b)
	return err
}

// writeTable prints r as an aligned table: one row per case and metric,
// ours then each baseline with the ratio ours/baseline.
func (r *Result) writeTable(w io.Writer) {
	fmt.Fprintf(w, "\n== %s (%.1fs): %s\n", r.Scenario, r.Seconds, r.title)
	if len(r.Params.keys) > 0 {
		var ps []string
		for _, k := range r.Params.keys {
			ps = append(ps, fmt.Sprintf("%s=%s", k, compact(r.Params.vals[k])))
		}
		fmt.Fprintf(w, "   params: %s\n", strings.Join(ps, " "))
	}
	if r.Error != "" {
		fmt.Fprintf(w, "   ERROR: %s\n", r.Error)
	}
	tw := tabwriter.NewWriter(w, 0, 0, 2, ' ', tabwriter.AlignRight)
	head := "   case\tmetric\tours\t"
	for _, b := range r.bases {
		head += b + "\tratio\t"
	}
	fmt.Fprintln(tw, head)
	for _, c := range r.cases {
		oc, _ := r.Ours.get(c)
		var metrics []string
		seen := map[string]bool{}
		add := func(m *omap) {
			if m == nil {
				return
			}
			for _, k := range m.keys {
				if !seen[k] {
					seen[k] = true
					metrics = append(metrics, k)
				}
			}
		}
		if oc != nil {
			add(oc.(*omap))
		}
		for _, b := range r.bases {
			bm, _ := r.Baseline.get(b)
			if bc, ok := bm.(*omap).get(c); ok {
				add(bc.(*omap))
			}
		}
		for _, metric := range metrics {
			ov := lookup(r.Ours, c, metric)
			rows := 1
			if isLat(ov) {
				rows = 3
			}
			for _, b := range r.bases {
				if isLat(lookup(r.Baseline, b, c, metric)) {
					rows = 3
				}
			}
			for i := range rows {
				name := metric
				if rows == 3 {
					name = metric + " " + []string{"p50", "p99", "max"}[i]
				}
				line := fmt.Sprintf("   %s\t%s\t%s\t", c, name, cell(ov, i))
				for _, b := range r.bases {
					bv := lookup(r.Baseline, b, c, metric)
					rv := lookup(r.Ratio, b, c, metric)
					line += cell(bv, i) + "\t" + cell(rv, i) + "\t"
				}
				fmt.Fprintln(tw, line)
			}
		}
	}
	tw.Flush()
	for _, t := range r.Targets {
		mark := "MISSED"
		if t.Met {
			mark = "met"
		}
		fmt.Fprintf(w, "   target [%s] %s: want %s, got %s\n", mark, t.Name, t.Want, t.Got)
	}
	for _, n := range r.Notes {
		fmt.Fprintf(w, "   note: %s\n", n)
	}
}

func lookup(m *omap, path ...string) any {
	var cur any = m
	for _, p := range path {
		om, ok := cur.(*omap)
		if !ok || om == nil {
			return nil
		}
		cur, ok = om.get(p)
		if !ok {
			return nil
		}
	}
	return cur
}

func isLat(v any) bool {
	switch x := v.(type) {
	case Lat:
		return true
	case *omap: // a ratio of latencies
		_, ok := x.get("p99")
		_, ok2 := x.get("p50")
		return ok || ok2
	}
	return false
}

// cell formats v for the table; row i of a latency is p50, p99, max.
func cell(v any, i int) string {
	switch x := v.(type) {
	case nil:
		return "-"
	case Lat:
		if x.N == 0 {
			return "-"
		}
		return fmtFloat([]float64{x.P50, x.P99, x.Max}[i])
	case *omap:
		y, ok := x.get([]string{"p50", "p99", "max"}[i])
		if !ok {
			return "-"
		}
		return cell(y, 0)
	case float64:
		return fmtFloat(x)
	case int:
		return fmt.Sprint(x)
	case int64:
		return fmt.Sprint(x)
	case bool:
		return fmt.Sprint(x)
	case string:
		return x
	}
	return compact(v)
}

func fmtFloat(x float64) string {
	switch ax := math.Abs(x); {
	case ax == 0:
		return "0"
	case ax >= 1000:
		return fmt.Sprintf("%.0f", x)
	case ax >= 100:
		return fmt.Sprintf("%.1f", x)
	case ax >= 1:
		return fmt.Sprintf("%.2f", x)
	default:
		return fmt.Sprintf("%.3f", x)
	}
}

func compact(v any) string {
	b, err := json.Marshal(v)
	if err != nil {
		return fmt.Sprint(v)
	}
	return string(b)
}
