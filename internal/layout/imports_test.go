// Package layout holds the test of the import rules that keep the
// single-writer shape visible in the code (docs/design.md, "Layout and
// dependency rules").
package layout_test

import (
	"encoding/json"
	"io"
	"os/exec"
	"slices"
	"strings"
	"testing"
)

const module = "github.com/converge-sync/converge/"

// pkg is what go list says of one package: its own imports and, for a
// command, everything it links.
type pkg struct {
	ImportPath string
	Imports    []string
	Deps       []string
}

func list(t *testing.T) map[string]pkg {
	t.Helper()
	cmd := exec.Command("go", "list", "-deps=false", "-json=ImportPath,Imports,Deps", module+"...")
	cmd.Dir = "../.."
	out, err := cmd.StdoutPipe()
	if err != nil {
		t.Fatal(err)
	}
	var stderr strings.Builder
	cmd.Stderr = &stderr
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	pkgs := map[string]pkg{}
	dec := json.NewDecoder(out)
	for {
		var p pkg
		if err := dec.Decode(&p); err == io.EOF {
			break
		} else if err != nil {
			t.Fatal(err)
		}
		pkgs[strings.TrimPrefix(p.ImportPath, module)] = p
	}
	if err := cmd.Wait(); err != nil {
		t.Fatalf("go list: %v\n%s", err, stderr.String())
	}
	if len(pkgs) < 20 {
		t.Fatalf("go list named %d packages; want the module's", len(pkgs))
	}
	return pkgs
}

// under reports whether path (relative to the module) is dir or in it.
func under(path string, dirs ...string) bool {
	return slices.ContainsFunc(dirs, func(d string) bool { return path == d || strings.HasPrefix(path, d+"/") })
}

// testOnly is a package made for tests: internal/testenv and every
// package whose name ends in "test".
func testOnly(path string) bool {
	last := path[strings.LastIndex(path, "/")+1:]
	return under(path, "internal/testenv", "internal/e2e", "internal/chaos", "internal/netfault") || strings.HasSuffix(last, "test")
}

// TestImportRules checks each rule on the packages' own (non-test)
// imports, and on what the commands link.
func TestImportRules(t *testing.T) {
	pkgs := list(t)
	imports := func(p pkg) []string {
		var out []string
		for _, i := range p.Imports {
			out = append(out, strings.TrimPrefix(i, module))
		}
		return out
	}
	postgres := func(i string) bool {
		return strings.HasPrefix(i, "github.com/jackc/") || strings.HasPrefix(i, "github.com/lib/pq")
	}
	stores := []string{"internal/index", "internal/graph", "internal/indexprojector", "internal/graphprojector"}
	checked := map[string]int{}
	for path, p := range pkgs {
		for _, i := range imports(p) {
			// pkg/contract, the producers' API, imports no package of
			// this module.
			if under(path, "pkg/contract") && strings.HasPrefix(i, "internal/") || under(path, "pkg/contract") && strings.HasPrefix(i, "pkg/") && !under(i, "pkg/contract") {
				t.Errorf("%s imports %s: pkg/contract imports no package of the module", path, i)
			}
			// Projectors never read Postgres.
			if under(path, "internal/projector", "internal/index", "internal/graph", "internal/indexprojector", "internal/graphprojector", "internal/notifier", "internal/rebuild") && !testOnly(path) {
				checked["projectors"]++
				if postgres(i) || under(i, "internal/docstore", "internal/schema", "internal/writer", "internal/relay", "internal/verify/postgres") {
					t.Errorf("%s imports %s: projector code never reads Postgres", path, i)
				}
			}
			// The relay writes no store.
			if under(path, "internal/relay") {
				checked["relay"]++
				if under(i, stores...) || under(i, "internal/projector") {
					t.Errorf("%s imports %s: the relay never imports an index or graph store", path, i)
				}
			}
			// Nothing under internal/ imports cmd/.
			if strings.HasPrefix(i, "cmd/") {
				t.Errorf("%s imports %s: nothing imports a command", path, i)
			}
			// Test helpers stay out of production code.
			if !testOnly(path) && testOnly(i) {
				t.Errorf("%s imports the test helper %s", path, i)
			}
		}
	}
	// Only internal/verify (read-only) and the commands see both the
	// index and the graph besides Postgres.
	for path, p := range pkgs {
		if testOnly(path) || under(path, "cmd", "internal/verify", "internal/stack") {
			continue
		}
		im := imports(p)
		index := slices.ContainsFunc(im, func(i string) bool { return under(i, "internal/index") })
		graph := slices.ContainsFunc(im, func(i string) bool { return under(i, "internal/graph") })
		checked["stores"]++
		if index && graph {
			t.Errorf("%s imports both the index and the graph: only internal/verify and cmd/ see every store", path)
		}
	}
	for _, rule := range []string{"projectors", "relay", "stores"} {
		if checked[rule] == 0 {
			t.Errorf("rule %q checked no import: the package list is not what the rule expects", rule)
		}
	}
}
