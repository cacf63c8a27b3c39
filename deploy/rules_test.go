package deploy

import (
	"encoding/json"
	"log/slog"
	"testing"

	"github.com/prometheus/common/model"
	"github.com/prometheus/prometheus/model/rulefmt"
	"github.com/prometheus/prometheus/promql/parser"
)

var promql = parser.NewParser(parser.Options{})

// selectors parses expr and returns the series names it selects, each
// with the label names it matches on.
func selectors(t *testing.T, expr string) map[string][]string {
	t.Helper()
	e, err := promql.ParseExpr(expr)
	if err != nil {
		t.Fatalf("%q: %v", expr, err)
	}
	out := map[string][]string{}
	parser.Inspect(e, func(n parser.Node, _ []parser.Node) error {
		if vs, ok := n.(*parser.VectorSelector); ok {
			var ls []string
			for _, m := range vs.LabelMatchers {
				ls = append(ls, m.Name)
			}
			out[vs.Name] = append(out[vs.Name], ls...)
		}
		return nil
	})
	if len(out) == 0 {
		t.Fatalf("%q selects no series", expr)
	}
	return out
}

// TestAlertRules parses deploy/prometheus/alerts.yml with Prometheus' own
// rule parser (strict: unknown fields are errors, every expression and
// template is parsed), checks that every metric and label it uses is one
// the registry defines, and that the alerts the runbook promises exist.
func TestAlertRules(t *testing.T) {
	rgs, errs := rulefmt.Parse(readFile(t, "prometheus/alerts.yml"), false, model.UTF8Validation, promql, slog.New(slog.DiscardHandler))
	for _, err := range errs {
		t.Error(err)
	}
	if len(errs) > 0 {
		t.FailNow()
	}
	defs := definedMetrics(t)
	used := map[string]bool{}
	alerts := 0
	for _, g := range rgs.Groups {
		for _, r := range g.Rules {
			if r.Alert == "" {
				t.Errorf("group %s: a recording rule %q; this file holds alerts only", g.Name, r.Record)
				continue
			}
			alerts++
			if r.Labels["severity"] == "" || r.Annotations["summary"] == "" {
				t.Errorf("alert %s: want a severity label and a summary annotation", r.Alert)
			}
			for name, ls := range selectors(t, r.Expr) {
				used[name] = true
				if why := checkSeries(defs, name, ls); why != "" {
					t.Errorf("alert %s: %s %s", r.Alert, name, why)
				}
			}
		}
	}
	// What operators were promised alerts on (docs/operations.md).
	for _, m := range []string{
		"registry_prober_leader",                 // no prober leader
		"registry_etcd_watch_restarts_total",     // etcd watch restarts
		"registry_resets_sent_total",             // subscriber resets
		"registry_fence_rejections_total",        // fence rejections
		"registry_instances",                     // instances UNAVAILABLE
		"registry_client_no_instance_total",      // clients that cannot call
		"registry_client_disk_cache_age_seconds", // a client serving its disk cache
	} {
		if !used[m] {
			t.Errorf("no alert uses %s", m)
		}
	}
	if alerts < 6 {
		t.Errorf("%d alerts, want at least 6", alerts)
	}
}

// TestDashboard checks deploy/grafana/registry.json: valid JSON, panels
// with unique ids, and every query a valid PromQL expression over metrics
// and labels the registry defines.
func TestDashboard(t *testing.T) {
	var d struct {
		UID    string `json:"uid"`
		Title  string `json:"title"`
		Panels []struct {
			ID      int    `json:"id"`
			Title   string `json:"title"`
			Targets []struct {
				Expr string `json:"expr"`
			} `json:"targets"`
		} `json:"panels"`
	}
	if err := json.Unmarshal(readFile(t, "grafana/registry.json"), &d); err != nil {
		t.Fatal(err)
	}
	if d.UID == "" || d.Title == "" || len(d.Panels) == 0 {
		t.Fatalf("dashboard without uid, title or panels: %+v", d)
	}
	defs := definedMetrics(t)
	ids := map[int]bool{}
	used := map[string]bool{}
	for _, p := range d.Panels {
		if ids[p.ID] {
			t.Errorf("panel id %d twice", p.ID)
		}
		ids[p.ID] = true
		if len(p.Targets) == 0 {
			t.Errorf("panel %q has no query", p.Title)
		}
		for _, tg := range p.Targets {
			for name, ls := range selectors(t, tg.Expr) {
				used[name] = true
				if why := checkSeries(defs, name, ls); why != "" {
					t.Errorf("panel %q: %s %s", p.Title, name, why)
				}
			}
		}
	}
	for _, m := range []string{"registry_prober_leader", "registry_etcd_watch_restarts_total", "registry_resets_sent_total", "registry_fence_rejections_total", "registry_subscribers"} {
		if !used[m] {
			t.Errorf("no panel shows %s", m)
		}
	}
}
