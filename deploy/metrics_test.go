package deploy

import (
	"go/ast"
	"go/parser"
	"go/token"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
)

// metricDef is one metric the registry's code defines: its kind and its
// label names.
type metricDef struct {
	histogram bool
	labels    map[string]bool
}

// metricSources are the packages whose code defines the exported metrics:
// regnode's /metrics, and the SDK's client.Metrics() collector.
var metricSources = []string{"../internal/metrics", "../balance"}

// definedMetrics reads the registry_* metrics the registry's code defines,
// from the source of metricSources: every Name in a prometheus *Opts
// literal passed to a New* constructor, and every prometheus.NewDesc, with
// their label names. It reads definitions rather than a scrape because a
// labelled metric nobody has touched yet is absent from /metrics.
func definedMetrics(t *testing.T) map[string]metricDef {
	t.Helper()
	defs := map[string]metricDef{}
	fset := token.NewFileSet()
	for _, dir := range metricSources {
		files, err := filepath.Glob(filepath.Join(dir, "*.go"))
		if err != nil || len(files) == 0 {
			t.Fatalf("no Go files in %s (%v)", dir, err)
		}
		for _, path := range files {
			if strings.HasSuffix(path, "_test.go") {
				continue
			}
			f, err := parser.ParseFile(fset, path, nil, 0)
			if err != nil {
				t.Fatal(err)
			}
			ast.Inspect(f, func(n ast.Node) bool {
				call, ok := n.(*ast.CallExpr)
				if !ok {
					return true
				}
				sel, ok := call.Fun.(*ast.SelectorExpr)
				if !ok || !strings.HasPrefix(sel.Sel.Name, "New") {
					return true
				}
				fn := sel.Sel.Name
				var name string
				var labelArg ast.Expr
				switch {
				case fn == "NewDesc" && len(call.Args) >= 3:
					name, labelArg = stringLit(call.Args[0]), call.Args[2]
				case len(call.Args) >= 1 && (strings.HasPrefix(fn, "NewCounter") || strings.HasPrefix(fn, "NewGauge") || strings.HasPrefix(fn, "NewHistogram") || strings.HasPrefix(fn, "NewSummary")):
					name = optsName(call.Args[0])
					if len(call.Args) >= 2 {
						labelArg = call.Args[1]
					}
				}
				if !strings.HasPrefix(name, "registry_") {
					return true
				}
				d := metricDef{histogram: strings.HasPrefix(fn, "NewHistogram"), labels: map[string]bool{}}
				if lit, ok := labelArg.(*ast.CompositeLit); ok {
					for _, e := range lit.Elts {
						d.labels[stringLit(e)] = true
					}
				}
				defs[name] = d
				return true
			})
		}
	}
	// A sanity floor: a parser that found nothing would pass every check.
	for _, must := range []string{"registry_prober_leader", "registry_fence_rejections_total", "registry_resets_sent_total", "registry_probe_seconds", "registry_client_no_instance_total"} {
		if _, ok := defs[must]; !ok {
			t.Fatalf("%s not found among the defined metrics %v", must, keys(defs))
		}
	}
	return defs
}

func optsName(e ast.Expr) string {
	if u, ok := e.(*ast.UnaryExpr); ok {
		e = u.X
	}
	lit, ok := e.(*ast.CompositeLit)
	if !ok {
		return ""
	}
	for _, el := range lit.Elts {
		if kv, ok := el.(*ast.KeyValueExpr); ok {
			if id, ok := kv.Key.(*ast.Ident); ok && id.Name == "Name" {
				return stringLit(kv.Value)
			}
		}
	}
	return ""
}

func stringLit(e ast.Expr) string {
	bl, ok := e.(*ast.BasicLit)
	if !ok || bl.Kind != token.STRING {
		return ""
	}
	s, err := strconv.Unquote(bl.Value)
	if err != nil {
		return ""
	}
	return s
}

func keys[V any](m map[string]V) []string {
	var ks []string
	for k := range m {
		ks = append(ks, k)
	}
	return ks
}

// targetLabels are added by Prometheus to every scraped series.
var targetLabels = map[string]bool{"job": true, "instance": true}

// checkSeries reports whether a series name and the label names it is
// matched on belong to a defined metric ("" if so, else why not).
// Histograms are queried through their _bucket, _sum and _count series;
// up is Prometheus' own.
func checkSeries(defs map[string]metricDef, name string, matchLabels []string) string {
	if name == "up" {
		return ""
	}
	d, ok := defs[name]
	extra := map[string]bool{}
	if !ok {
		for _, suf := range []string{"_bucket", "_sum", "_count"} {
			if base, cut := strings.CutSuffix(name, suf); cut && defs[base].histogram {
				d, ok = defs[base], true
				if suf == "_bucket" {
					extra["le"] = true
				}
			}
		}
	}
	if !ok {
		return "is not a metric the registry defines"
	}
	for _, l := range matchLabels {
		if l != "__name__" && !d.labels[l] && !targetLabels[l] && !extra[l] {
			return "has no label " + strconv.Quote(l)
		}
	}
	return ""
}

func readFile(t *testing.T, path string) []byte {
	t.Helper()
	b, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	return b
}
