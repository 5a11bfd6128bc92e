package main

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"strconv"
	"strings"
	"testing"

	"github.com/nats-io/nats.go"

	"github.com/converge-sync/converge/internal/config"
	"github.com/converge-sync/converge/internal/deadletter"
	"github.com/converge-sync/converge/internal/deadletter/deadlettertest"
	"github.com/converge-sync/converge/internal/testenv"
	"github.com/converge-sync/converge/internal/writer"
	"github.com/converge-sync/converge/pkg/contract"
)

// The dead-letter protocol itself (what a redrive publishes and deletes)
// is tested in internal/deadletter; these tests pin the command: its
// arguments, its output and its JSON.

func runDLQ(t *testing.T, fx *deadlettertest.Fixture, args ...string) (string, error) {
	t.Helper()
	var out bytes.Buffer
	err := dlqCmd(context.Background(), append(args, "-nats-url", fx.URL), &out)
	return out.String(), err
}

func mustRunDLQ(t *testing.T, fx *deadlettertest.Fixture, args ...string) string {
	t.Helper()
	out, err := runDLQ(t, fx, args...)
	if err != nil {
		t.Fatalf("dlq %v: %v\n%s", args, err, out)
	}
	return out
}

func TestDlqListAndShow(t *testing.T) {
	fx := deadlettertest.New(t)

	out := mustRunDLQ(t, fx, "list")
	for _, want := range []string{"CONSUMER", "CODES", "graph_rejected=1", "invalid_json=1 store_rejected=2", "invalid_document=2"} {
		if !strings.Contains(out, want) {
			t.Fatalf("list lacks %q:\n%s", want, out)
		}
	}
	var rep deadletter.Summary
	if err := json.Unmarshal([]byte(mustRunDLQ(t, fx, "list", "--json")), &rep); err != nil {
		t.Fatal(err)
	}
	if !rep.Exists || rep.Capped || rep.Scanned != 6 || len(rep.Consumers) != 3 || rep.Consumers[1].Consumer != "index" || rep.Consumers[1].Codes["store_rejected"] != 2 {
		t.Fatalf("list %+v", rep)
	}
	var raw map[string]any
	if err := json.Unmarshal([]byte(mustRunDLQ(t, fx, "list", "--json")), &raw); err != nil {
		t.Fatal(err)
	}
	for _, k := range []string{"stream", "exists", "consumers", "scanned", "capped"} {
		if _, ok := raw[k]; !ok {
			t.Errorf("list --json lacks %q: %v", k, raw)
		}
	}

	// A capped summary says its codes are partial.
	var cappedOut bytes.Buffer
	printDLQList(&cappedOut, deadletter.Summary{Stream: deadletter.Stream, Exists: true, Scanned: 4, Capped: true,
		Consumers: []deadletter.ConsumerSummary{{Consumer: "index", DeadLetters: 3, Codes: map[string]uint64{"x": 4}}}})
	if !strings.Contains(cappedOut.String(), "first 4 dead letters only") {
		t.Fatalf("capped list does not say so:\n%s", cappedOut.String())
	}

	// Flags may follow the consumer.
	out = mustRunDLQ(t, fx, "show", "index")
	idx := fx.Seqs["index"]
	for _, want := range []string{
		"dead letters of index (converge.dlq.index): 3",
		fmt.Sprintf("#%d  ", idx[0]),
		"store_rejected",
		"original: " + contract.Subject("docs/a") + " (CONVERGE_DOCS seq 1)",
		`payload:  event document.upserted key "docs/a" version 3`,
		`payload:  event document.withdrawn key "docs/c" version 2`,
		`payload:  10 bytes: "\x00\xffnot json"`,
		"reason:   invalid_json: cannot process " + contract.Subject("docs/b"),
	} {
		if !strings.Contains(out, want) {
			t.Fatalf("show lacks %q:\n%s", want, out)
		}
	}
	if strings.Contains(out, "graph_rejected") {
		t.Fatalf("show index shows another consumer's dead letter:\n%s", out)
	}
	if out := mustRunDLQ(t, fx, "show", "ingest", "--limit", "1"); !strings.Contains(out, ": 2, the oldest 1 shown (--limit)") {
		t.Fatalf("show --limit 1:\n%s", out)
	}

	var show deadletter.Page
	if err := json.Unmarshal([]byte(mustRunDLQ(t, fx, "show", "--json", "ingest", "--limit", "1")), &show); err != nil {
		t.Fatal(err)
	}
	if show.Consumer != "ingest" || show.Total != 2 || !show.Truncated || len(show.DeadLetters) != 1 {
		t.Fatalf("show --limit 1: %+v", show)
	}
	e := show.DeadLetters[0]
	if e.Seq != fx.Seqs["ingest"][0] || e.Code != "invalid_document" || e.OriginalSubj != contract.IngestSubject("in/1") ||
		e.OriginalStream != writer.IngestStream || e.OriginalSeq == 0 || e.Time.IsZero() || e.Payload.Key != "in/1" {
		t.Fatalf("entry %+v", e)
	}
}

func TestDlqRedrive(t *testing.T) {
	fx := deadlettertest.New(t)
	idx := fx.Seqs["index"]
	docsBefore := deadlettertest.Msgs(t, fx.Docs)

	out := mustRunDLQ(t, fx, "redrive", "index", "--seq", strconv.FormatUint(idx[0], 10))
	if !strings.Contains(out, fmt.Sprintf("redriven #%d to %s (CONVERGE_DOCS seq %d)\n", idx[0], contract.Subject("docs/a"), docsBefore+1)) ||
		!strings.Contains(out, "1 dead letters of index redriven and deleted from CONVERGE_DLQ") {
		t.Fatalf("redrive said:\n%s", out)
	}
	if !fx.Gone(t, idx[0]) {
		t.Fatalf("dead letter #%d still there", idx[0])
	}
	if _, err := runDLQ(t, fx, "redrive", "index", "--seq", strconv.FormatUint(idx[0], 10)); err == nil || !strings.Contains(err.Error(), "dlq: no dead letter") {
		t.Fatalf("redrive of a redriven dead letter: %v", err)
	}
	// Another consumer's dead letter is refused.
	if _, err := runDLQ(t, fx, "redrive", "index", "--seq", fmt.Sprintf("%d,%d", idx[1], fx.Seqs["graph"][0])); err == nil || !strings.Contains(err.Error(), "not converge.dlq.index") {
		t.Fatalf("redrive of graph's dead letter as index's: %v", err)
	}

	out = mustRunDLQ(t, fx, "redrive", "--all", "ingest")
	if !strings.Contains(out, "2 dead letters of ingest redriven") {
		t.Fatalf("redrive --all said:\n%s", out)
	}
	if got := deadlettertest.Msgs(t, fx.Ingest); got != 2 {
		t.Fatalf("%s holds %d messages after the redrive, want 2", writer.IngestStream, got)
	}
	if _, err := runDLQ(t, fx, "redrive", "ingest", "--all"); err == nil || !strings.Contains(err.Error(), `"ingest"`) {
		t.Fatalf("redrive of a consumer without dead letters: %v", err)
	}
}

func TestDlqRedriveDryRunChangesNothing(t *testing.T) {
	fx := deadlettertest.New(t)
	dlqBefore, docsBefore := deadlettertest.Msgs(t, fx.DLQ), deadlettertest.Msgs(t, fx.Docs)
	out := mustRunDLQ(t, fx, "redrive", "index", "--all", "--dry-run")
	for _, seq := range fx.Seqs["index"] {
		if !strings.Contains(out, fmt.Sprintf("would redrive #%d to converge.docs.", seq)) {
			t.Fatalf("dry run does not name #%d:\n%s", seq, out)
		}
	}
	if !strings.Contains(out, `(CONVERGE_DOCS): event document.upserted key "docs/a" version 3`) ||
		!strings.Contains(out, "dry run: 3 dead letters of index would be redriven; nothing changed") {
		t.Fatalf("dry run said:\n%s", out)
	}
	mustRunDLQ(t, fx, "redrive", "graph", "--seq", strconv.FormatUint(fx.Seqs["graph"][0], 10), "--dry-run")
	if deadlettertest.Msgs(t, fx.DLQ) != dlqBefore || deadlettertest.Msgs(t, fx.Docs) != docsBefore {
		t.Fatal("a dry run changed the streams")
	}
}

// A redrive that stops on a dead letter it refuses names it and says how
// many it redrove before.
func TestDlqRedriveStopped(t *testing.T) {
	fx := deadlettertest.New(t)
	m := nats.NewMsg(contract.DLQSubject("index"))
	m.Header.Set(deadletter.HeaderStream, contract.DocsStream)
	m.Data = []byte(`{"not":"an event"}`)
	ack, err := fx.JS.PublishMsg(context.Background(), m)
	if err != nil {
		t.Fatal(err)
	}
	out, err := runDLQ(t, fx, "redrive", "index", "--seq", fmt.Sprintf("%d,%d", fx.Seqs["index"][0], ack.Sequence))
	if err == nil || !strings.Contains(err.Error(), deadletter.HeaderSubject) || !strings.Contains(err.Error(), fmt.Sprintf("#%d", ack.Sequence)) ||
		!strings.Contains(out, "stopped after 1 redriven\n") {
		t.Fatalf("redrive stopped by a dead letter without a subject: %v\n%s", err, out)
	}
}

func TestDlqErrors(t *testing.T) {
	fx := deadlettertest.New(t)
	for _, args := range [][]string{{"show", "nope"}, {"redrive", "nope", "--all"}} {
		_, err := runDLQ(t, fx, args...)
		if err == nil || !strings.Contains(err.Error(), `"nope"`) || !strings.Contains(err.Error(), "graph, index, ingest") {
			t.Errorf("%v: %v, want the known consumers", args, err)
		}
	}
	for _, tc := range []struct {
		args []string
		want string
	}{
		{[]string{"redrive", "index"}, "--all"},
		{[]string{"redrive", "index", "--all", "--seq", "1"}, "exclude"},
		{[]string{"redrive", "index", "--seq", "x"}, "not a stream sequence"},
		{[]string{"redrive", "index", "--seq", "999"}, "no dead letter #999"},
		{[]string{"redrive", "--all"}, "one consumer"},
		{[]string{"show"}, "one consumer"},
		{[]string{"show", "index", "graph"}, "one consumer"},
		{[]string{"show", "index", "--limit", "-1"}, "want 0 (all) or more"},
		{[]string{"list", "index"}, "no arguments"},
		{[]string{"sideways"}, "unknown dlq subcommand"},
	} {
		if _, err := runDLQ(t, fx, tc.args...); err == nil || !strings.Contains(err.Error(), tc.want) {
			t.Errorf("%v: %v, want %q", tc.args, err, tc.want)
		}
	}
	if got := deadlettertest.Msgs(t, fx.DLQ); got != 6 {
		t.Fatalf("refused commands changed %s: %d dead letters", deadletter.Stream, got)
	}

	t.Setenv(config.EnvNATSURL, "")
	var out bytes.Buffer
	if err := dlqCmd(context.Background(), []string{"list"}, &out); err == nil || !strings.Contains(err.Error(), config.EnvNATSURL) {
		t.Fatalf("missing NATS URL: %v", err)
	}
	if err := dlqCmd(context.Background(), nil, &out); err != nil || !strings.Contains(out.String(), "operator action") {
		t.Fatalf("help: %v %q", err, out.String())
	}
}

func TestDlqWithoutStream(t *testing.T) {
	n := testenv.StartNATS(t)
	var out bytes.Buffer
	if err := dlqCmd(context.Background(), []string{"list", "-nats-url", n.URL}, &out); err != nil || !strings.Contains(out.String(), "does not exist") {
		t.Fatalf("list: %v %q", err, out.String())
	}
	err := dlqCmd(context.Background(), []string{"show", "index", "-nats-url", n.URL}, &out)
	if err == nil || !strings.Contains(err.Error(), "no consumer has any") {
		t.Fatalf("show: %v", err)
	}
}
