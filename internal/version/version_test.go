package version

import (
	"runtime/debug"
	"strings"
	"testing"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/testutil"
)

func TestFromBuild(t *testing.T) {
	bi := &debug.BuildInfo{GoVersion: "go1.26.0", Main: debug.Module{Version: "v1.2.3"},
		Settings: []debug.BuildSetting{{Key: "vcs.revision", Value: "0123456789abcdef0123"}, {Key: "vcs.modified", Value: "true"}}}
	i := fromBuild(bi, true)
	if i != (Info{Version: "v1.2.3", Commit: "0123456789abcdef0123", Modified: true, Go: "go1.26.0"}) {
		t.Fatalf("info %+v", i)
	}
	if s := i.String(); s != "converge v1.2.3 commit 0123456789ab (modified) go1.26.0" {
		t.Fatalf("string %q", s)
	}
	if i := fromBuild(nil, false); i.Version != "unknown" || i.Commit != "unknown" || i.Go != "unknown" {
		t.Fatalf("without build info: %+v", i)
	}
	if i := fromBuild(&debug.BuildInfo{GoVersion: "go1.26.0"}, true); i.Commit != "unknown" || i.Version != "unknown" {
		t.Fatalf("without settings: %+v", i)
	}
}

// The gauge carries the test binary's own build: its Go version at least.
func TestCollector(t *testing.T) {
	reg := prometheus.NewRegistry()
	reg.MustRegister(Collector())
	want := `converge_build_info{commit="` + Get().Commit + `",goversion="` + Get().Go + `",modified="` + map[bool]string{true: "true", false: "false"}[Get().Modified] + `",version="` + Get().Version + `"} 1`
	if err := testutil.CollectAndCompare(reg, strings.NewReader("# HELP converge_build_info "+
		"The build a process runs: its module version, commit, whether the tree was modified, and Go version; always 1.\n# TYPE converge_build_info gauge\n"+want+"\n"), "converge_build_info"); err != nil {
		t.Fatal(err)
	}
	if !strings.HasPrefix(Get().Go, "go") {
		t.Fatalf("go version %q", Get().Go)
	}
}
