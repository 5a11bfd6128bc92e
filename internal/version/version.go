// Package version is what a converge binary was built from, read from the
// build information Go records in every binary: the module's version, the
// commit and whether the tree had changes, and the Go version. Every binary
// prints it with -version (`converge version`), and every service exports
// it on /metrics as converge_build_info.
package version

import (
	"fmt"
	"runtime/debug"
	"sync"

	"github.com/prometheus/client_golang/prometheus"
)

// Info is a build's identity. A field the build did not record is
// "unknown": a binary built outside a git checkout has no commit, and one
// built from the checkout (not from a tagged module) has the version
// "(devel)".
type Info struct {
	Version  string `json:"version"`
	Commit   string `json:"commit"`
	Modified bool   `json:"modified"` // the tree had uncommitted changes
	Go       string `json:"go"`
}

var (
	once sync.Once
	info Info
)

// Get is this binary's Info.
func Get() Info {
	once.Do(func() { info = fromBuild(debug.ReadBuildInfo()) })
	return info
}

func fromBuild(bi *debug.BuildInfo, ok bool) Info {
	i := Info{Version: "unknown", Commit: "unknown", Go: "unknown"}
	if !ok {
		return i
	}
	i.Go = bi.GoVersion
	if v := bi.Main.Version; v != "" {
		i.Version = v
	}
	for _, s := range bi.Settings {
		switch s.Key {
		case "vcs.revision":
			i.Commit = s.Value
		case "vcs.modified":
			i.Modified = s.Value == "true"
		}
	}
	return i
}

// String is the one line -version prints: "converge (devel) commit 1a2b3c4
// (modified) go1.26".
func (i Info) String() string {
	commit := i.Commit
	if len(commit) > 12 {
		commit = commit[:12]
	}
	if i.Modified {
		commit += " (modified)"
	}
	return fmt.Sprintf("converge %s commit %s %s", i.Version, commit, i.Go)
}

// Collector is the gauge converge_build_info, always 1, whose labels are
// the build's Info: a dashboard joins it to tell which build each instance
// runs.
func Collector() prometheus.Collector {
	i := Get()
	g := prometheus.NewGauge(prometheus.GaugeOpts{
		Name: "converge_build_info",
		Help: "The build a process runs: its module version, commit, whether the tree was modified, and Go version; always 1.",
		ConstLabels: prometheus.Labels{"version": i.Version, "commit": i.Commit,
			"modified": fmt.Sprint(i.Modified), "goversion": i.Go},
	})
	g.Set(1)
	return g
}
