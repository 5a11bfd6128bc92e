package main

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"strconv"
	"strings"
	"testing"

	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/nats-io/nats.go"

	"github.com/converge-sync/converge/internal/config"
	"github.com/converge-sync/converge/internal/deadletter"
	"github.com/converge-sync/converge/internal/deadletter/deadlettertest"
	"github.com/converge-sync/converge/internal/docstore"
	"github.com/converge-sync/converge/internal/notifier"
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

// newDLQWriter is the writer's API over a fresh database holding docs
// (key: version).
func newDLQWriter(t *testing.T, docs map[string]int64) (url string, pool *pgxpool.Pool, store *docstore.Store) {
	t.Helper()
	srv, pool := newWriterAPI(t, 0)
	store, err := docstore.New(pool, docstore.Config{}, nil)
	if err != nil {
		t.Fatal(err)
	}
	var writes []docstore.Write
	for k, v := range docs {
		writes = append(writes, docstore.Write{Doc: contract.Document{Key: k, Version: v, Body: "body of " + k}})
	}
	if _, err := store.Apply(context.Background(), writes); err != nil {
		t.Fatal(err)
	}
	return srv.URL, pool, store
}

// reemissions returns the number of re-emitted outbox rows of key.
func reemissions(t *testing.T, pool *pgxpool.Pool, key string) int {
	t.Helper()
	var n int
	if err := pool.QueryRow(context.Background(), `SELECT count(*) FROM outbox WHERE key = $1 AND emission > 0`, key).Scan(&n); err != nil {
		t.Fatal(err)
	}
	return n
}

func TestDlqRedrive(t *testing.T) {
	fx := deadlettertest.New(t)
	url, pool, _ := newDLQWriter(t, map[string]int64{"docs/a": 5})
	idx := fx.Seqs["index"]
	docsBefore := deadlettertest.Msgs(t, fx.Docs)

	// A projector's dead letter: re-emitted by the writer, not published
	// by the command.
	out := mustRunDLQ(t, fx, "redrive", "index", "--seq", strconv.FormatUint(idx[0], 10), "-writer-url", url)
	if !strings.Contains(out, fmt.Sprintf("redriven #%d to %s, re-emitted: \"docs/a\" version 5 (emission 1, newer than the dead letter's version 3)\n", idx[0], contract.Subject("docs/a"))) ||
		!strings.Contains(out, "1 dead letters of index redriven and deleted from CONVERGE_DLQ (1 re-emitted, 0 republished)") {
		t.Fatalf("redrive said:\n%s", out)
	}
	if !fx.Gone(t, idx[0]) {
		t.Fatalf("dead letter #%d still there", idx[0])
	}
	if got := reemissions(t, pool, "docs/a"); got != 1 {
		t.Fatalf("%d re-emissions of docs/a in the outbox, want 1", got)
	}
	if got := deadlettertest.Msgs(t, fx.Docs); got != docsBefore {
		t.Fatalf("the command published to %s: %d messages, want %d", contract.DocsStream, got, docsBefore)
	}
	if _, err := runDLQ(t, fx, "redrive", "index", "--seq", strconv.FormatUint(idx[0], 10), "-writer-url", url); err == nil || !strings.Contains(err.Error(), "dlq: no dead letter") {
		t.Fatalf("redrive of a redriven dead letter: %v", err)
	}
	// Another consumer's dead letter is refused.
	if _, err := runDLQ(t, fx, "redrive", "index", "--seq", fmt.Sprintf("%d,%d", idx[1], fx.Seqs["graph"][0]), "-writer-url", url); err == nil || !strings.Contains(err.Error(), "not converge.dlq.index") {
		t.Fatalf("redrive of graph's dead letter as index's: %v", err)
	}

	// What the writer cannot re-emit stays, reported, and the command
	// fails: docs/b's data names no document, docs/c is not in Postgres.
	out, err := runDLQ(t, fx, "redrive", "index", "--all", "-writer-url", url)
	if err == nil || !strings.Contains(err.Error(), "2 dead letters of index kept in CONVERGE_DLQ") {
		t.Fatalf("redrive --all of what the writer cannot re-emit: %v\n%s", err, out)
	}
	for _, want := range []string{
		fmt.Sprintf("kept #%d (%s): its data names no document key", idx[1], contract.Subject("docs/b")),
		fmt.Sprintf("kept #%d (%s): the writer has no document \"docs/c\" (not found in Postgres)", idx[2], contract.Subject("docs/c")),
		"0 dead letters of index redriven",
	} {
		if !strings.Contains(out, want) {
			t.Fatalf("redrive --all lacks %q:\n%s", want, out)
		}
	}
	if fx.Gone(t, idx[1]) || fx.Gone(t, idx[2]) {
		t.Fatal("a dead letter the writer did not re-emit was deleted")
	}

	// Ingest dead letters are republished, and need no writer.
	out = mustRunDLQ(t, fx, "redrive", "--all", "ingest", "-writer-url", "http://127.0.0.1:1")
	if !strings.Contains(out, "2 dead letters of ingest redriven and deleted from CONVERGE_DLQ (0 re-emitted, 2 republished)") ||
		!strings.Contains(out, fmt.Sprintf("redriven #%d to %s (CONVERGE_INGEST seq ", fx.Seqs["ingest"][0], contract.IngestSubject("in/1"))) ||
		strings.Count(out, "), republished\n") != 2 {
		t.Fatalf("redrive --all said:\n%s", out)
	}
	if got := deadlettertest.Msgs(t, fx.Ingest); got != 2 {
		t.Fatalf("%s holds %d messages after the redrive, want 2", writer.IngestStream, got)
	}
	if _, err := runDLQ(t, fx, "redrive", "ingest", "--all"); err == nil || !strings.Contains(err.Error(), `"ingest"`) {
		t.Fatalf("redrive of a consumer without dead letters: %v", err)
	}
}

// A document the writer cannot reproduce keeps its dead letter; the
// others of the same redrive are re-emitted.
func TestDlqRedriveNotReproducible(t *testing.T) {
	fx := deadlettertest.New(t)
	url, pool, _ := newDLQWriter(t, map[string]int64{"docs/a": 3, "docs/d": 1})
	if _, err := pool.Exec(context.Background(), `DELETE FROM chunks WHERE key = 'docs/d'`); err != nil {
		t.Fatal(err)
	}
	data, err := contract.NewUpsertedEvent(contract.Document{Key: "docs/d", Version: 1, Body: "body of docs/d"}, []string{"body of docs/d"}).Encode()
	if err != nil {
		t.Fatal(err)
	}
	fx.DeadLetter(t, "graph", contract.Subject("docs/d"), data, "graph_rejected")
	out, err := runDLQ(t, fx, "redrive", "graph", "--all", "-writer-url", url)
	if err == nil || !strings.Contains(err.Error(), "1 dead letters of graph kept") {
		t.Fatalf("redrive: %v\n%s", err, out)
	}
	g := fx.Seqs["graph"]
	if !strings.Contains(out, fmt.Sprintf("redriven #%d to %s, re-emitted: \"docs/a\" version 3 (emission ", g[0], contract.Subject("docs/a"))) ||
		!strings.Contains(out, fmt.Sprintf("kept #%d (%s): the writer cannot re-emit it: ", g[1], contract.Subject("docs/d"))) ||
		!strings.Contains(out, "not_reproducible") || !strings.Contains(out, "1 dead letters of graph redriven and deleted from CONVERGE_DLQ (1 re-emitted, 0 republished)") {
		t.Fatalf("redrive said:\n%s", out)
	}
	if !fx.Gone(t, g[0]) || fx.Gone(t, g[1]) || reemissions(t, pool, "docs/a") != 1 || reemissions(t, pool, "docs/d") != 0 {
		t.Fatal("the redrive deleted or re-emitted the wrong dead letters")
	}
	if strings.Contains(out, "notify-replayed") {
		t.Fatalf("a projector's redrive speaks of the notifier:\n%s", out)
	}
}

// A writer that does not answer leaves every dead letter.
func TestDlqRedriveWriterDown(t *testing.T) {
	fx := deadlettertest.New(t)
	before := deadlettertest.Msgs(t, fx.DLQ)
	out, err := runDLQ(t, fx, "redrive", "graph", "--all", "-writer-url", "http://127.0.0.1:1")
	if err == nil || !strings.Contains(err.Error(), "does not answer") || !strings.Contains(err.Error(), "-writer-url, env CONVERGE_WRITER_URL") {
		t.Fatalf("redrive with the writer down: %v\n%s", err, out)
	}
	if deadlettertest.Msgs(t, fx.DLQ) != before {
		t.Fatal("a redrive the writer did not answer deleted dead letters")
	}
	if _, err := runDLQ(t, fx, "redrive", "graph", "--all", "-writer-url", "127.0.0.1:8080"); err == nil || !strings.Contains(err.Error(), "-writer-url must be http://") {
		t.Fatalf("a malformed writer URL: %v", err)
	}
}

// A notifier's dead letter is re-emitted, and the command says that the
// notifier sends nothing for it unless it runs with -notify-replayed.
func TestDlqRedriveNotifier(t *testing.T) {
	fx := deadlettertest.New(t)
	url, pool, _ := newDLQWriter(t, map[string]int64{"docs/a": 3})
	fx.DeadLetter(t, "notifier", contract.Subject("docs/a"), fx.Data[fx.Seqs["index"][0]], notifier.DeadLetterCode)
	for _, args := range [][]string{{"--dry-run"}, nil} {
		out := mustRunDLQ(t, fx, append([]string{"redrive", "notifier", "--all", "-writer-url", url}, args...)...)
		if !strings.Contains(out, "re-emitted") || !strings.Contains(out, "the notifier skips a re-emitted event unless it runs with -notify-replayed") ||
			!strings.Contains(out, "no webhook is sent for these") {
			t.Fatalf("redrive of the notifier's dead letter %v said:\n%s", args, out)
		}
	}
	if !fx.Gone(t, fx.Seqs["notifier"][0]) || reemissions(t, pool, "docs/a") != 1 {
		t.Fatal("the notifier's dead letter was not re-emitted")
	}
	if out := mustRunDLQ(t, fx, "help"); !strings.Contains(out, "-notify-replayed") || !strings.Contains(out, "sends no webhook") {
		t.Fatalf("help does not say what a notifier redrive does:\n%s", out)
	}
}

func TestDlqRedriveDryRunChangesNothing(t *testing.T) {
	fx := deadlettertest.New(t)
	dlqBefore, docsBefore := deadlettertest.Msgs(t, fx.DLQ), deadlettertest.Msgs(t, fx.Docs)
	// A dry run asks the writer nothing: none answers here.
	out := mustRunDLQ(t, fx, "redrive", "index", "--all", "--dry-run", "-writer-url", "http://127.0.0.1:1")
	idx := fx.Seqs["index"]
	for _, i := range []int{0, 2} {
		if !strings.Contains(out, fmt.Sprintf("would redrive #%d to converge.docs.", idx[i])) {
			t.Fatalf("dry run does not name #%d:\n%s", idx[i], out)
		}
	}
	if !strings.Contains(out, `(CONVERGE_DOCS), re-emitted: the writer's current version of "docs/a"; event document.upserted key "docs/a" version 3`) ||
		!strings.Contains(out, fmt.Sprintf("would keep #%d (%s): its data names no document key", idx[1], contract.Subject("docs/b"))) ||
		!strings.Contains(out, "dry run: 2 dead letters of index would be redriven (2 re-emitted, 0 republished); nothing changed") ||
		!strings.Contains(out, "dry run: 1 would be kept") {
		t.Fatalf("dry run said:\n%s", out)
	}
	out = mustRunDLQ(t, fx, "redrive", "ingest", "--all", "--dry-run")
	if !strings.Contains(out, "(CONVERGE_INGEST), republished: not a valid event") {
		t.Fatalf("dry run of ingest said:\n%s", out)
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
	url, _, _ := newDLQWriter(t, map[string]int64{"docs/a": 3})
	m := nats.NewMsg(contract.DLQSubject("index"))
	m.Header.Set(deadletter.HeaderStream, contract.DocsStream)
	m.Data = []byte(`{"not":"an event"}`)
	ack, err := fx.JS.PublishMsg(context.Background(), m)
	if err != nil {
		t.Fatal(err)
	}
	out, err := runDLQ(t, fx, "redrive", "index", "--seq", fmt.Sprintf("%d,%d", fx.Seqs["index"][0], ack.Sequence), "-writer-url", url)
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
