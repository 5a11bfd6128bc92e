package deploy

import (
	"os"
	"regexp"
	"slices"
	"strings"
	"testing"

	"github.com/prometheus/common/model"
	"gopkg.in/yaml.v3"
)

type ruleFile struct {
	Groups []struct {
		Name  string `yaml:"name"`
		Rules []rule `yaml:"rules"`
	} `yaml:"groups"`
}

type rule struct {
	Alert       string            `yaml:"alert"`
	Expr        string            `yaml:"expr"`
	For         string            `yaml:"for"`
	Labels      map[string]string `yaml:"labels"`
	Annotations map[string]string `yaml:"annotations"`
}

// labelsOf are the label names of a metric's description: its constant
// and its variable labels.
func labelsOf(desc string) []string {
	var out []string
	for _, field := range []string{"constLabels", "variableLabels"} {
		m := regexp.MustCompile(field + `: \{([^}]*)\}`).FindStringSubmatch(desc)
		if m == nil || m[1] == "" {
			continue
		}
		for _, l := range strings.Split(m[1], ",") {
			name, _, _ := strings.Cut(l, "=")
			out = append(out, strings.TrimSuffix(strings.TrimPrefix(name, "c("), ")"))
		}
	}
	return out
}

var (
	// selector is a metric's name and its label matchers.
	selector = regexp.MustCompile(`\b((?:converge|process|go)_[a-z0-9_]+)\{([^}]*)\}`)
	// matcher is a label name in a selector.
	matcher = regexp.MustCompile(`([a-zA-Z_][a-zA-Z0-9_]*)\s*(?:=~|!~|!=|=)`)
	// grouping is the labels of "by (...)".
	grouping = regexp.MustCompile(`\bby\s*\(([^)]*)\)`)
)

// Every alert of prometheus/alerts.yml is well formed and names only
// metrics the services register, with only the labels they carry (or the
// ones Prometheus adds to every series it scrapes), and the verifier's
// alerts cover what it proves: differences named, repairs that cannot be,
// passes that do not complete, a verifier that stalls.
func TestAlertsQueryExportedMetrics(t *testing.T) {
	data, err := os.ReadFile("prometheus/alerts.yml")
	if err != nil {
		t.Fatal(err)
	}
	var f ruleFile
	dec := yaml.NewDecoder(strings.NewReader(string(data)))
	dec.KnownFields(true)
	if err := dec.Decode(&f); err != nil {
		t.Fatalf("prometheus/alerts.yml: %v", err)
	}
	descs := described(t)
	scraped := []string{"job", "instance", "le"}
	names := map[string]bool{}
	queried := map[string]bool{}
	for _, g := range f.Groups {
		if g.Name == "" || len(g.Rules) == 0 {
			t.Errorf("group %q: a name and rules are needed", g.Name)
		}
		for _, r := range g.Rules {
			if !regexp.MustCompile(`^Converge[A-Z][A-Za-z]+$`).MatchString(r.Alert) || names[r.Alert] {
				t.Errorf("alert %q: a unique name Converge... is needed", r.Alert)
			}
			names[r.Alert] = true
			if sev := r.Labels["severity"]; sev != "critical" && sev != "warning" {
				t.Errorf("%s: severity %q, want critical or warning", r.Alert, sev)
			}
			if r.Annotations["summary"] == "" || r.Annotations["description"] == "" {
				t.Errorf("%s: a summary and a description are needed", r.Alert)
			}
			if r.For != "" {
				if _, err := model.ParseDuration(r.For); err != nil {
					t.Errorf("%s: for %q: %v", r.Alert, r.For, err)
				}
			}
			if strings.Count(r.Expr, "(") != strings.Count(r.Expr, ")") || strings.Count(r.Expr, "{") != strings.Count(r.Expr, "}") {
				t.Errorf("%s: unbalanced brackets in %s", r.Alert, r.Expr)
			}
			var exprLabels []string
			for _, n := range metricName.FindAllString(r.Expr, -1) {
				base := n
				for _, suffix := range []string{"_bucket", "_sum", "_count"} {
					if b, ok := strings.CutSuffix(n, suffix); ok && descs[b] != nil {
						base = b
					}
				}
				if descs[base] == nil {
					t.Errorf("%s queries %s, which no service exports", r.Alert, n)
					continue
				}
				queried[base] = true
				exprLabels = append(exprLabels, labelsOf(descs[base].String())...)
			}
			for _, m := range selector.FindAllStringSubmatch(r.Expr, -1) {
				if descs[m[1]] == nil {
					continue
				}
				have := append(labelsOf(descs[m[1]].String()), scraped...)
				for _, l := range matcher.FindAllStringSubmatch(m[2], -1) {
					if !slices.Contains(have, l[1]) {
						t.Errorf("%s: %s has no label %q (it has %v)", r.Alert, m[1], l[1], have)
					}
				}
			}
			for _, m := range grouping.FindAllStringSubmatch(r.Expr, -1) {
				for _, l := range strings.Split(m[1], ",") {
					if l = strings.TrimSpace(l); !slices.Contains(append(exprLabels, scraped...), l) {
						t.Errorf("%s: by (%s): no metric of the expression has the label %q", r.Alert, m[1], l)
					}
				}
			}
		}
	}
	for _, need := range []string{
		"converge_verify_differences", "converge_verify_repairs_total", "converge_verify_last_full_pass_timestamp_seconds",
		"converge_verify_buckets_compared_total", "converge_verify_projection_behind_total",
		"converge_relay_active", "converge_projector_missed_events_total", "converge_projector_dead_letters_total",
	} {
		if !queried[need] {
			t.Errorf("no alert on %s", need)
		}
	}
}
