package apicheck

import (
	"bytes"
	"encoding/json"
	"fmt"
	"go/importer"
	"go/token"
	"go/types"
	"io"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strings"
	"testing"
)

const module = "github.com/regcluster/registry"

// listed is what `go list -export -json` says of a package.
type listed struct {
	ImportPath string
	Name       string
	Export     string
	Standard   bool
}

// exportData lists every package of the module and of its dependencies
// with the file of its compiled export data (built, or from the build
// cache).
func exportData(t *testing.T) (ours []listed, files map[string]string) {
	t.Helper()
	cmd := exec.Command("go", "list", "-export", "-deps", "-json=ImportPath,Name,Export,Standard", module+"/...")
	cmd.Dir = "../.."
	var stderr bytes.Buffer
	cmd.Stderr = &stderr
	out, err := cmd.Output()
	if err != nil {
		t.Fatalf("go list -export: %v\n%s", err, stderr.String())
	}
	files = map[string]string{}
	dec := json.NewDecoder(bytes.NewReader(out))
	for {
		var p listed
		if err := dec.Decode(&p); err == io.EOF {
			break
		} else if err != nil {
			t.Fatal(err)
		}
		files[p.ImportPath] = p.Export
		if strings.HasPrefix(p.ImportPath, module+"/") || p.ImportPath == module {
			ours = append(ours, p)
		}
	}
	return ours, files
}

func internalPath(path string) bool {
	return strings.HasPrefix(path, module+"/") &&
		(strings.Contains(path, "/internal/") || strings.HasSuffix(path, "/internal"))
}

// leaks walks the exported API of pkg and names every exported
// declaration whose type mentions a type of an internal package.
func leaks(pkg *types.Package) []string {
	var out []string
	report := func(where string, typ types.Type) {
		seen := map[types.Type]bool{}
		var bad []string
		var walk func(types.Type)
		walk = func(t types.Type) {
			if t == nil || seen[t] {
				return
			}
			seen[t] = true
			switch t := t.(type) {
			case *types.Alias:
				if p := t.Obj().Pkg(); p != nil && internalPath(p.Path()) {
					bad = append(bad, p.Path()+"."+t.Obj().Name())
				}
				walk(types.Unalias(t))
			case *types.Named:
				if p := t.Obj().Pkg(); p != nil && internalPath(p.Path()) {
					bad = append(bad, p.Path()+"."+t.Obj().Name())
				}
				if ta := t.TypeArgs(); ta != nil {
					for i := range ta.Len() {
						walk(ta.At(i))
					}
				}
				// A named type of another package is its own API; ours
				// are walked as declarations.
			case *types.Pointer:
				walk(t.Elem())
			case *types.Slice:
				walk(t.Elem())
			case *types.Array:
				walk(t.Elem())
			case *types.Map:
				walk(t.Key())
				walk(t.Elem())
			case *types.Chan:
				walk(t.Elem())
			case *types.Signature:
				for i := range t.Params().Len() {
					walk(t.Params().At(i).Type())
				}
				for i := range t.Results().Len() {
					walk(t.Results().At(i).Type())
				}
			case *types.Struct:
				for i := range t.NumFields() {
					if f := t.Field(i); f.Exported() {
						walk(f.Type())
					}
				}
			case *types.Interface:
				for i := range t.NumMethods() {
					if m := t.Method(i); m.Exported() {
						walk(m.Type())
					}
				}
				for i := range t.NumEmbeddeds() {
					walk(t.EmbeddedType(i))
				}
			}
		}
		walk(typ)
		for _, b := range slices.Compact(bad) {
			out = append(out, fmt.Sprintf("%s names %s", where, b))
		}
	}
	scope := pkg.Scope()
	for _, name := range scope.Names() {
		obj := scope.Lookup(name)
		if !obj.Exported() {
			continue
		}
		where := pkg.Path() + "." + name
		switch obj := obj.(type) {
		case *types.TypeName:
			if named, ok := obj.Type().(*types.Named); ok && !obj.IsAlias() {
				report(where, named.Underlying())
				for i := range named.NumMethods() {
					if m := named.Method(i); m.Exported() {
						report(where+"."+m.Name(), m.Type())
					}
				}
			} else {
				report(where, obj.Type())
			}
		default:
			report(where, obj.Type())
		}
	}
	return out
}

// importAll imports every non-main package of the module from its export
// data, with positions in fset.
func importAll(t *testing.T, fset *token.FileSet) []*types.Package {
	t.Helper()
	ours, files := exportData(t)
	imp := importer.ForCompiler(fset, "gc", func(path string) (io.ReadCloser, error) {
		f, ok := files[path]
		if !ok || f == "" {
			return nil, fmt.Errorf("no export data for %s", path)
		}
		return os.Open(f)
	})
	var pkgs []*types.Package
	for _, p := range ours {
		if p.Name == "main" {
			continue
		}
		pkg, err := imp.Import(p.ImportPath)
		if err != nil {
			t.Fatalf("import %s: %v", p.ImportPath, err)
		}
		pkgs = append(pkgs, pkg)
	}
	return pkgs
}

// No package outside internal/ exports a name whose type (a field, a
// parameter, a result, an embedded or aliased type, a method of an
// exported type) is an internal package's: such a name is public API that
// only the module itself can use. main packages export nothing.
func TestNoInternalTypeInPublicAPI(t *testing.T) {
	var bad []string
	checked := 0
	for _, pkg := range importAll(t, token.NewFileSet()) {
		if internalPath(pkg.Path()) {
			continue
		}
		checked++
		bad = append(bad, leaks(pkg)...)
	}
	if checked < 10 {
		t.Fatalf("checked %d public packages; the listing is broken", checked)
	}
	if len(bad) > 0 {
		t.Errorf("%d exported names of public packages name internal types:\n%s", len(bad), strings.Join(bad, "\n"))
	}
}

// Every package's exported sentinel errors (package-level Err* variables
// of type error), which its callers branch on with errors.Is, are declared
// in one file, so they read as one documented block: errors.go where a
// package has several files of them to gather.
func TestSentinelsInOneFile(t *testing.T) {
	fset := token.NewFileSet()
	errType := types.Universe.Lookup("error").Type()
	var bad []string
	sentinels := 0
	for _, pkg := range importAll(t, fset) {
		files := map[string][]string{}
		for _, name := range pkg.Scope().Names() {
			v, ok := pkg.Scope().Lookup(name).(*types.Var)
			if !ok || !v.Exported() || !strings.HasPrefix(name, "Err") || !types.Identical(v.Type(), errType) {
				continue
			}
			f := fset.Position(v.Pos()).Filename
			if f == "" {
				t.Fatalf("%s.%s: export data without positions", pkg.Path(), name)
			}
			files[filepath.Base(f)] = append(files[filepath.Base(f)], name)
			sentinels++
		}
		if len(files) > 1 {
			bad = append(bad, fmt.Sprintf("%s: %v", pkg.Path(), files))
		}
	}
	if sentinels < 10 {
		t.Fatalf("found %d sentinels in the module; the listing is broken", sentinels)
	}
	if len(bad) > 0 {
		t.Errorf("packages whose sentinel errors are spread over several files:\n%s", strings.Join(bad, "\n"))
	}
}
