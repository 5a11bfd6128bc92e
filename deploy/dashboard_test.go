package deploy

import (
	"context"
	"encoding/json"
	"os"
	"regexp"
	"sort"
	"strings"
	"testing"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/converge-sync/converge/internal/auth"
	"github.com/converge-sync/converge/internal/natsauth"
	"github.com/converge-sync/converge/internal/notifier"
	"github.com/converge-sync/converge/internal/projector"
	"github.com/converge-sync/converge/internal/rebuild"
	"github.com/converge-sync/converge/internal/relay"
	"github.com/converge-sync/converge/internal/telemetry"
	"github.com/converge-sync/converge/internal/verify"
	"github.com/converge-sync/converge/internal/writer"
)

// exported names every metric the services register: each service's own
// (as its Run registers them on its registry), the bearer-token guard's,
// the NATS permission counter's, the rebuilds', the continuous verifier's
// (converge verify -watch), and the Go and process collectors every
// registry carries. Described, not gathered, so that a vector none of
// whose labels was seen yet counts too.
func exported(t *testing.T) map[string]bool {
	t.Helper()
	out := map[string]bool{}
	for name := range described(t) {
		out[name] = true
	}
	if !out["converge_relay_slot_lag_bytes"] || !out["converge_projector_dead_letters_total"] || !out["go_goroutines"] {
		t.Fatalf("the metrics described are not the services': %v", out)
	}
	return out
}

// described is the description of every metric the services register, by
// name (see exported).
func described(t *testing.T) map[string]*prometheus.Desc {
	t.Helper()
	reg := telemetry.NewRegistry()
	writer.NewMetrics(reg)
	relay.NewMetrics(reg)
	projector.NewMetrics(reg, "index")
	notifier.NewMetrics(reg)
	auth.NewGuard(nil, reg, nil)
	natsauth.DeniedCounter(reg)
	m, err := rebuild.NewManager(rebuild.Config{Runtime: projector.Config{Name: "graph"}}, inPlace{}, nil, nil)
	if err != nil {
		t.Fatal(err)
	}
	if err := m.Register(reg); err != nil {
		t.Fatal(err)
	}
	verify.NewWatchMetrics(reg)
	ch := make(chan *prometheus.Desc)
	go func() {
		reg.Describe(ch)
		close(ch)
	}()
	fqName := regexp.MustCompile(`fqName: "([^"]+)"`)
	out := map[string]*prometheus.Desc{}
	for d := range ch {
		if m := fqName.FindStringSubmatch(d.String()); m != nil {
			out[m[1]] = d
		}
	}
	return out
}

// inPlace is a projection rebuilt in place, for a manager that never runs.
type inPlace struct{}

func (inPlace) Live(context.Context) (string, error)                      { return "graph", nil }
func (inPlace) Open(context.Context, string) (*rebuild.Generation, error) { return nil, nil }
func (inPlace) Describe(name string) string                               { return name }
func (inPlace) Wipe(context.Context, *rebuild.Generation) error           { return nil }

type dashboard struct {
	Title      string `json:"title"`
	UID        string `json:"uid"`
	Templating struct {
		List []struct {
			Name, Type string
		} `json:"list"`
	} `json:"templating"`
	Panels []panel `json:"panels"`
}

type panel struct {
	ID         int    `json:"id"`
	Type       string `json:"type"`
	Title      string `json:"title"`
	Datasource *struct {
		UID string `json:"uid"`
	} `json:"datasource"`
	Targets []struct {
		Expr string `json:"expr"`
	} `json:"targets"`
}

// metricName is a name in a PromQL expression that is a metric's: a
// function's name is followed by "(", a label's by "=" or sits in "by (...)".
var metricName = regexp.MustCompile(`\b((?:converge|process|go)_[a-z0-9_]+)\b`)

// The dashboard queries only metrics the services export, and shows every
// part of the pipeline the operations need: slot lag, consumer lag, commit
// to stored and to applied, dead letters, the notifier's outcomes, the
// rebuilds, and what the continuous verifier proves.
func TestDashboardQueriesExportedMetrics(t *testing.T) {
	data, err := os.ReadFile("grafana/converge.json")
	if err != nil {
		t.Fatal(err)
	}
	var d dashboard
	if err := json.Unmarshal(data, &d); err != nil {
		t.Fatalf("grafana/converge.json: %v", err)
	}
	if d.Title == "" || d.UID == "" || len(d.Templating.List) == 0 || d.Templating.List[0].Type != "datasource" {
		t.Fatalf("grafana/converge.json: a title, a uid and a datasource variable are needed: %+v", d)
	}
	have := exported(t)
	queried := map[string]bool{}
	ids := map[int]bool{}
	for _, p := range d.Panels {
		if ids[p.ID] {
			t.Errorf("panel id %d twice", p.ID)
		}
		ids[p.ID] = true
		if p.Type == "row" {
			continue
		}
		if p.Datasource == nil || p.Datasource.UID != "${datasource}" || len(p.Targets) == 0 {
			t.Errorf("panel %q: it needs the datasource variable and a query", p.Title)
		}
		for _, q := range p.Targets {
			if strings.Count(q.Expr, "(") != strings.Count(q.Expr, ")") {
				t.Errorf("panel %q: unbalanced parentheses in %s", p.Title, q.Expr)
			}
			names := metricName.FindAllString(q.Expr, -1)
			if len(names) == 0 {
				t.Errorf("panel %q: %s queries no metric", p.Title, q.Expr)
			}
			for _, n := range names {
				base := n
				for _, suffix := range []string{"_bucket", "_sum", "_count"} {
					if b, ok := strings.CutSuffix(n, suffix); ok && have[b] {
						base = b
					}
				}
				queried[base] = true
				if !have[base] {
					t.Errorf("panel %q queries %s, which no service exports", p.Title, n)
				}
			}
		}
	}
	for _, need := range []string{
		"converge_relay_slot_lag_bytes", "converge_projector_consumer_pending", "converge_relay_commit_to_ack_seconds",
		"converge_projector_commit_to_applied_seconds", "converge_projector_dead_letters_total",
		"converge_writer_ingest_dead_letters_total", "converge_notifier_dead_lettered_total", "converge_notifier_sent_total",
		"converge_notifier_deduplicated_total", "converge_rebuild_in_progress", "converge_rebuilds_completed_total",
		"converge_projector_missed_events_total", "converge_verify_proven_fraction", "converge_verify_differences",
		"converge_verify_last_full_pass_timestamp_seconds", "converge_verify_repairs_total",
	} {
		if !queried[need] {
			t.Errorf("the dashboard does not show %s", need)
		}
	}
	var own []string
	for n := range have {
		if strings.HasPrefix(n, "converge_") && !queried[n] {
			own = append(own, n)
		}
	}
	sort.Strings(own)
	t.Logf("%d metrics queried; converge's not on the dashboard: %s", len(queried), strings.Join(own, ", "))
}
