package main

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net/http"
	"net/http/httptest"
	"path/filepath"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/google/uuid"

	"github.com/converge-sync/converge/internal/auth"
	"github.com/converge-sync/converge/internal/graph"
	graphembedded "github.com/converge-sync/converge/internal/graph/embedded"
	"github.com/converge-sync/converge/internal/notifier"
	"github.com/converge-sync/converge/internal/stack"
	"github.com/converge-sync/converge/pkg/contract"
)

// damageGraph stops the dev stack's graph projector (a child process),
// applies docs to its embedded graph behind its back, and starts it again.
func damageGraph(t *testing.T, s *stack.Stack, docs ...graph.Doc) {
	t.Helper()
	if err := s.KillGraphChild(); err != nil {
		t.Fatal(err)
	}
	g, err := graphembedded.Open(filepath.Join(s.DataDir, "graph"), graphembedded.Options{})
	if err != nil {
		t.Fatal(err)
	}
	applied, err := g.Apply(context.Background(), docs)
	if cerr := g.Close(); err == nil {
		err = cerr
	}
	if err != nil {
		t.Fatal(err)
	}
	for i, ok := range applied {
		if !ok {
			t.Fatalf("damage %s was not applied", docs[i].Key)
		}
	}
	if err := s.StartGraphChild(context.Background()); err != nil {
		t.Fatalf("the restarted graph projector: %v", err)
	}
}

// graphView is what the graph projector serves about key, as a Doc.
func graphView(t *testing.T, s *stack.Stack, key string) graph.Doc {
	t.Helper()
	v, err := (&graph.Client{Addr: s.GraphAddr, Token: s.OperatorToken}).Document(context.Background(), key)
	if err != nil {
		t.Fatal(err)
	}
	d := graph.Doc{Key: v.Key, Version: v.Version, Deleted: v.Deleted, Title: v.Title, ContentHash: v.ContentHash, Links: v.LinksOut, Tags: v.Tags}
	for _, c := range v.Chunks {
		id, err := uuid.Parse(c.ID)
		if err != nil {
			t.Fatal(err)
		}
		d.Chunks = append(d.Chunks, graph.Chunk{ID: id, Ordinal: c.Ordinal, ContentHash: c.ContentHash})
	}
	return d
}

// converge verify --repair, through the whole pipeline on embedded
// defaults: documents damaged in the graph behind its projector's back are
// named, re-emitted through the writer and repaired, and verify exits 0;
// a document only the graph has is reported as beyond repair by
// re-emission, and verify exits non-zero.
func TestVerifyRepairThroughTheDevStack(t *testing.T) {
	if testing.Short() {
		t.Skip("starts the whole pipeline")
	}
	ctx, cancel := context.WithTimeout(context.Background(), 4*time.Minute)
	defer cancel()
	dbURL := devDatabase(t)
	// The stack runs the notifier too, posting to this receiver.
	const secret = "test-secret"
	var hooksMu sync.Mutex
	hooks := map[string]string{} // Idempotency-Key -> "key version"
	var badHooks []string
	posts := 0
	receiver := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		body, _ := io.ReadAll(r.Body)
		var n struct {
			Key     string `json:"key"`
			Version int64  `json:"version"`
		}
		hooksMu.Lock()
		defer hooksMu.Unlock()
		posts++
		if err := notifier.Verify([]byte(secret), r.Header.Get("Converge-Timestamp"), r.Header.Get("Converge-Signature"), body, time.Minute, time.Now()); err != nil {
			badHooks = append(badHooks, err.Error())
		} else if err := json.Unmarshal(body, &n); err != nil {
			badHooks = append(badHooks, err.Error())
		} else {
			hooks[r.Header.Get("Idempotency-Key")] = fmt.Sprintf("%s %d", n.Key, n.Version)
		}
	}))
	defer receiver.Close()
	t.Setenv(notifier.EnvWebhookURLs, receiver.URL)
	t.Setenv(notifier.EnvWebhookSecret, secret)
	notified := func() (int, []string) {
		hooksMu.Lock()
		defer hooksMu.Unlock()
		if posts != len(hooks) {
			return len(hooks), append(slices.Clone(badHooks), fmt.Sprintf("%d POSTs for %d effects", posts, len(hooks)))
		}
		return len(hooks), slices.Clone(badHooks)
	}

	cfg := devConfig(t, dbURL)
	cfg.GraphChild = true
	s, err := stack.Start(ctx, cfg)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		if err := s.Stop(); err != nil {
			t.Errorf("stop: %v", err)
		}
	})
	if s.Notifier == nil {
		t.Fatal("dev does not run the notifier with CONVERGE_WEBHOOK_URLS set")
	}
	// converge verify runs as the operator, with the dev stack's token.
	t.Setenv(auth.EnvToken+"_FILE", s.OperatorTokenFile)

	for i := range 20 {
		para := strings.Repeat(fmt.Sprintf("Paragraph about topic %d, with enough words to fill a chunk. ", i), 12)
		body := fmt.Sprintf(`{"version":1,"title":"Doc %d","body":%q,"links":["doc-%02d"],"tags":["t%d"]}`, i, para+"\n\n"+para+"\n\n"+para, (i+1)%20, i%3)
		req, _ := http.NewRequestWithContext(ctx, http.MethodPut, s.APIURL+"/v1/documents/"+fmt.Sprintf("doc-%02d", i), strings.NewReader(body))
		req.Header.Set("Content-Type", "application/json")
		auth.SetBearer(req.Header, s.WriterToken)
		resp, err := http.DefaultClient.Do(req)
		if err != nil {
			t.Fatal(err)
		}
		_ = resp.Body.Close()
		if resp.StatusCode != http.StatusOK {
			t.Fatalf("PUT doc-%02d: %s", i, resp.Status)
		}
	}
	verifyArgs := []string{"verify", "-postgres-url", dbURL, "-index-addr", cfg.IndexAddr, "-graph-addr", cfg.GraphAddr}
	if err := stack.WaitUntil(ctx, ctx, 60*time.Second, func() bool {
		return run(ctx, verifyArgs, &bytes.Buffer{}) == nil
	}); err != nil {
		t.Fatalf("the stores did not agree with Postgres: %v", err)
	}

	if err := stack.WaitUntil(ctx, ctx, 60*time.Second, func() bool { n, _ := notified(); return n >= 20 }); err != nil {
		n, bad := notified()
		t.Fatalf("the notifier posted %d of 20 notifications (%v); bad: %v", n, err, bad)
	}

	// Damage: doc-03 keeps one chunk of its version, doc-07 links elsewhere.
	g3, g7 := graphView(t, s, "doc-03"), graphView(t, s, "doc-07")
	if len(g3.Chunks) < 2 || len(g7.Chunks) == 0 {
		t.Fatalf("doc-03 has %d chunks, doc-07 %d: the test needs several", len(g3.Chunks), len(g7.Chunks))
	}
	g3.Chunks, g7.Links = g3.Chunks[:1], []string{"nowhere"}
	g3.Repair, g7.Repair = true, true
	damageGraph(t, s, g3, g7)
	var out bytes.Buffer
	if err := run(ctx, verifyArgs, &out); !errors.Is(err, errDisagree) ||
		!strings.Contains(out.String(), "stale_chunks     doc-03") || !strings.Contains(out.String(), "links_mismatch   doc-07") {
		t.Fatalf("verify after the damage: %v\n%s", err, out.String())
	}

	// Verified by partition, as a projector in 4 partitions would be:
	// doc-03's partition disagrees on it alone, a partition of neither
	// damaged document agrees.
	p3, p7 := contract.Partition("doc-03", 4), contract.Partition("doc-07", 4)
	out.Reset()
	if err := run(ctx, append(slices.Clone(verifyArgs), "-partitions", "4"), &out); !errors.Is(err, errDisagree) ||
		!strings.Contains(out.String(), fmt.Sprintf("stale_chunks     doc-03 (partition %d)", p3)) ||
		!strings.Contains(out.String(), "by partition (of 4): ") {
		t.Fatalf("verify -partitions 4 after the damage: %v\n%s", err, out.String())
	}
	out.Reset()
	if err := run(ctx, append(slices.Clone(verifyArgs), "-partitions", "4", "-partition", fmt.Sprint(p3)), &out); !errors.Is(err, errDisagree) ||
		!strings.Contains(out.String(), fmt.Sprintf("graph  DISAGREES on partition %d of 4", p3)) || !strings.Contains(out.String(), "doc-03") ||
		(p7 != p3 && strings.Contains(out.String(), "doc-07")) {
		t.Fatalf("verify -partition %d (doc-03's) after the damage: %v\n%s", p3, err, out.String())
	}
	clean := -1
	for p := range 4 {
		if p != p3 && p != p7 {
			clean = p
		}
	}
	out.Reset()
	if err := run(ctx, append(slices.Clone(verifyArgs), "-partitions", "4", "-partition", fmt.Sprint(clean)), &out); err != nil ||
		!strings.Contains(out.String(), fmt.Sprintf("graph  agrees with Postgres on partition %d of 4", clean)) {
		t.Fatalf("verify -partition %d (of no damaged document) after the damage: %v\n%s", clean, err, out.String())
	}

	out.Reset()
	repairArgs := append(verifyArgs, "--repair", "-writer-url", s.APIURL, "-repair-timeout", "60s")
	if err := run(ctx, repairArgs, &out); err != nil {
		t.Fatalf("verify --repair: %v\n%s", err, out.String())
	}
	t.Logf("verify --repair:\n%s", out.String())
	for _, want := range []string{"graph  DISAGREES", "re-emitting 2 documents", "repaired 2 differences",
		"graph  stale_chunks     doc-03", "graph  links_mismatch   doc-07", "graph  agrees with Postgres on all 20 documents"} {
		if !strings.Contains(out.String(), want) {
			t.Errorf("verify --repair output lacks %q:\n%s", want, out.String())
		}
	}

	// The repair re-emitted two events: they repair projections and are not
	// notified again.
	reemissionsSkipped := func() bool {
		resp, err := http.Get("http://" + cfg.NotifierAddr + "/metrics")
		if err != nil {
			return false
		}
		defer resp.Body.Close()
		b, _ := io.ReadAll(resp.Body)
		return strings.Contains(string(b), `converge_notifier_skipped_total{reason="reemission"} 2`)
	}
	if err := stack.WaitUntil(ctx, ctx, 30*time.Second, reemissionsSkipped); err != nil {
		t.Fatalf("the notifier did not skip the 2 re-emissions: %v", err)
	}
	if n, bad := notified(); n != 20 || len(bad) > 0 {
		t.Errorf("after the repair the receiver has %d notifications (want 20, one per document version), bad: %v", n, bad)
	}

	// A document only the graph has cannot be repaired by re-emission.
	damageGraph(t, s, graph.Doc{Key: "ghost", Version: 1, ContentHash: "x"})
	out.Reset()
	err = run(ctx, append(repairArgs, "--json"), &out)
	var rep verifyReport
	if jerr := json.Unmarshal(out.Bytes(), &rep); jerr != nil {
		t.Fatalf("%v: %s", jerr, out.String())
	}
	if !errors.Is(err, errDisagree) || rep.Agrees || rep.Repair == nil || len(rep.Repair.Unrepairable) != 1 ||
		rep.Repair.Unrepairable[0].Key != "ghost" || rep.Repair.Unrepairable[0].Problem != "extra" || len(rep.Repair.Reemitted) != 0 {
		t.Fatalf("verify --repair with an extra document: %v %+v", err, rep.Repair)
	}
}
