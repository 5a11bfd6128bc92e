package main

import (
	"context"
	"errors"
	"fmt"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/chromedp/cdproto/page"
	"github.com/chromedp/chromedp"
	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/converge-sync/converge/internal/auth"
	"github.com/converge-sync/converge/internal/console"
	"github.com/converge-sync/converge/internal/deadletter"
	"github.com/converge-sync/converge/internal/natsauth"
	"github.com/converge-sync/converge/internal/rebuild"
	"github.com/converge-sync/converge/internal/relay"
	"github.com/converge-sync/converge/internal/stack"
	"github.com/converge-sync/converge/internal/writer"
	"github.com/converge-sync/converge/pkg/client"
	"github.com/converge-sync/converge/pkg/contract"
)

// envScreenshots names the directory where the browser test saves its
// screenshots (docs/console to refresh the documentation's); empty: a
// temporary directory.
const envScreenshots = "CONVERGE_CONSOLE_SCREENSHOTS"

// chromiumPath is a headless Chromium, installed by
// scripts/ensure-chromium.sh when missing and possible; the test fails
// without one in CI and is skipped elsewhere.
func chromiumPath(t *testing.T) string {
	t.Helper()
	out, err := exec.Command("bash", "../../scripts/ensure-chromium.sh").Output()
	path := strings.TrimSpace(string(out))
	if err == nil && path != "" {
		return path
	}
	msg := "no Chromium for the console's browser test: scripts/ensure-chromium.sh could not find or install it (as root on Debian it installs the chromium package; or set CONVERGE_CHROMIUM)"
	var ee *exec.ExitError
	if errors.As(err, &ee) {
		msg += ": " + strings.TrimSpace(string(ee.Stderr))
	}
	if os.Getenv("CI") == "true" {
		t.Fatal(msg)
	}
	t.Skip(msg)
	return ""
}

// browser starts a headless Chromium on a fresh profile, with everything
// that would reach the network on its own turned off.
func browser(t *testing.T, ctx context.Context, path string) context.Context {
	t.Helper()
	opts := append(slices.Clone(chromedp.DefaultExecAllocatorOptions[:]),
		chromedp.ExecPath(path),
		chromedp.UserDataDir(t.TempDir()),
		chromedp.Flag("headless", true),
		chromedp.NoSandbox,
		chromedp.DisableGPU,
		chromedp.NoFirstRun,
		chromedp.Flag("disable-quic", true),
		chromedp.Flag("disable-background-networking", true),
		chromedp.Flag("disable-component-update", true),
		chromedp.Flag("disable-sync", true),
		chromedp.WindowSize(1280, 900),
	)
	actx, cancelAlloc := chromedp.NewExecAllocator(ctx, opts...)
	bctx, cancelBrowser := chromedp.NewContext(actx)
	t.Cleanup(func() { cancelBrowser(); cancelAlloc() })
	if err := chromedp.Run(bctx); err != nil {
		t.Fatalf("start chromium %s: %v", path, err)
	}
	return bctx
}

// tab opens the console in a new tab of the browser with token; window
// confirmations are accepted, and their texts kept in confirmed.
func tab(t *testing.T, bctx context.Context, url, token string, confirmed *[]string, mu *sync.Mutex) context.Context {
	t.Helper()
	tctx, cancel := chromedp.NewContext(bctx)
	t.Cleanup(cancel)
	chromedp.ListenTarget(tctx, func(ev any) {
		if d, ok := ev.(*page.EventJavascriptDialogOpening); ok {
			mu.Lock()
			*confirmed = append(*confirmed, d.Message)
			mu.Unlock()
			go func() { _ = chromedp.Run(tctx, page.HandleJavaScriptDialog(true)) }()
		}
	})
	if err := chromedp.Run(tctx, chromedp.Navigate(url+"#token="+token), chromedp.WaitVisible("#main", chromedp.ByID)); err != nil {
		t.Fatalf("open the console: %v", err)
	}
	return tctx
}

// eventually evaluates the page's expression js every 100ms until it is
// true, failing after timeout with what the page showed.
func eventually(t *testing.T, tctx context.Context, what, js string, timeout time.Duration) {
	t.Helper()
	deadline := time.Now().Add(timeout)
	for {
		var ok bool
		err := chromedp.Run(tctx, chromedp.Evaluate(js, &ok))
		if err == nil && ok {
			return
		}
		if time.Now().After(deadline) {
			var text string
			_ = chromedp.Run(tctx, chromedp.Evaluate(`document.body.innerText`, &text))
			t.Fatalf("the console never showed %s (%v):\n%s", what, err, text)
		}
		time.Sleep(100 * time.Millisecond)
	}
}

func screenshot(t *testing.T, tctx context.Context, dir, name, sel string) {
	t.Helper()
	var png []byte
	if err := chromedp.Run(tctx, chromedp.ScrollIntoView(sel, chromedp.ByQuery), chromedp.Screenshot(sel, &png, chromedp.ByQuery)); err != nil {
		t.Fatalf("screenshot %s: %v", name, err)
	}
	if err := os.WriteFile(filepath.Join(dir, name), png, 0o644); err != nil {
		t.Fatal(err)
	}
}

// The console in a real browser over the real pipeline (the dev stack,
// its graph projector a process, converge verify -watch --repair, and
// converge console with its own tokens): the picture shows every stage
// with its rate and lag; a poison message published to the documents'
// stream appears among the dead letters with its reason, and is redriven
// from the page after a confirmation (re-emitted: gone from CONVERGE_DLQ);
// a rebuild of the index shows its progress moving; a document damaged in
// the graph behind its projector's back shows up as a difference, and
// then as repaired; a read token sees the dead letters but no redrive
// button, and the API refuses its redrive all the same.
func TestConsoleInABrowser(t *testing.T) {
	if testing.Short() {
		t.Skip("starts the whole pipeline and a browser")
	}
	chromium := chromiumPath(t)
	shots := os.Getenv(envScreenshots)
	if shots == "" {
		shots = t.TempDir()
	} else if err := os.MkdirAll(shots, 0o755); err != nil {
		t.Fatal(err)
	}
	began := time.Now()
	ctx, cancel := context.WithTimeout(context.Background(), 3*time.Minute)
	defer cancel()
	dbURL := devDatabase(t)
	cfg := devConfig(t, dbURL)
	var verifyAddr, consoleAddr string
	freeAddrs(t, &verifyAddr, &consoleAddr)
	cfg.GraphChild = true
	// Small batches: a rebuild lasts long enough to be seen moving.
	t.Setenv("CONVERGE_PROJECTOR_BATCH", "2")
	s, err := stack.Start(ctx, cfg)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		if err := s.Stop(); err != nil {
			t.Errorf("stop: %v", err)
		}
	})
	t.Setenv(auth.EnvToken+"_FILE", s.OperatorTokenFile)
	t.Setenv(natsauth.EnvPassword+"_FILE", s.OperatorNATSPasswordFile)
	// Enough events in the stream for a rebuild to take a while.
	wc, err := client.New(s.APIURL, client.WithToken(s.WriterToken))
	if err != nil {
		t.Fatal(err)
	}
	const docs = 1500
	para := strings.Repeat("A paragraph of the console's test corpus, with enough words to fill a chunk. ", 6)
	stats, err := wc.Batch(ctx, func(yield func(client.Write) bool) {
		for i := range docs {
			body := para
			if i == 3 { // several chunks, one to cut off
				body = strings.Repeat(para+"\n\n", 4)
			}
			if !yield(client.Write{Doc: client.Document{Key: fmt.Sprintf("doc-%04d", i), Version: 1, Title: "Doc", Body: body,
				Links: []string{"doc-0000"}, Tags: []string{"t"}}}) {
				return
			}
		}
	}, func(client.LineResult) error { return nil })
	if err != nil || stats.Applied != docs {
		t.Fatalf("batch: %+v %v", stats, err)
	}

	// The console's tokens: the operator's, and one that may only read.
	readToken := "viewer-" + strconv.FormatInt(time.Now().UnixNano(), 36) + "-read-only-token"
	tokens := filepath.Join(t.TempDir(), "console-tokens")
	if err := os.WriteFile(tokens, []byte(fmt.Sprintf("operator admin,read %s\nviewer read %s\n", s.OperatorToken, readToken)), 0o600); err != nil {
		t.Fatal(err)
	}
	bg, stopBackground := context.WithCancel(ctx)
	var wg sync.WaitGroup
	var logs lockedBuffer
	background := func(name string, args ...string) {
		wg.Add(1)
		go func() {
			defer wg.Done()
			if err := run(bg, args, &logs); err != nil && bg.Err() == nil {
				t.Errorf("%s ended: %v", name, err)
			}
		}()
	}
	defer func() { stopBackground(); wg.Wait() }()
	background("verify -watch", "verify", "-watch", "--repair", "-postgres-url", dbURL, "-index-addr", cfg.IndexAddr, "-graph-addr", cfg.GraphAddr,
		"-nats-url", s.NATSURL, "-nats-user", natsauth.UserOperator, "-writer-url", s.APIURL, "-metrics-addr", verifyAddr,
		"-buckets", "64", "-watch-step", "32", "-watch-pass", "1s", "-watch-wait", "3s", "-log-level", "error")
	background("console", "console", "-addr", consoleAddr, "-postgres-url", s.ReaderURL, "-nats-url", s.NATSURL, "-nats-user", natsauth.UserOperator,
		"-writer-url", s.APIURL, "-writer-metrics-addr", cfg.WriterAddr, "-relay-metrics-addr", cfg.RelayAddr,
		"-index-addr", cfg.IndexAddr, "-graph-addr", cfg.GraphAddr, "-verify-addr", verifyAddr, "-interval", "100ms",
		"-tokens-file", tokens, "-log-level", "error")
	consoleURL := "http://" + consoleAddr + "/"
	if err := stack.WaitUntil(ctx, ctx, 30*time.Second, func() bool { return stack.HTTPOK(consoleURL) }); err != nil {
		t.Fatalf("the console does not answer: %v\n%s", err, logs.String())
	}

	bctx := browser(t, ctx, chromium)
	var mu sync.Mutex
	var confirmed []string
	admin := tab(t, bctx, consoleURL, s.OperatorToken, &confirmed, &mu)
	t.Logf("pipeline and browser up after %s", time.Since(began).Round(100*time.Millisecond))

	// The picture: every stage, with a rate, and the stores proven whole.
	stage := func(id string) string { return fmt.Sprintf(`document.querySelector('#picture g[data-stage=%q]')`, id) }
	for _, id := range []string{"writer:writer", "slot:" + relay.DefaultSlot, "relay:relay", "stream:" + contract.DocsStream,
		"consumer:" + contract.DocsStream + "/index", "consumer:" + contract.DocsStream + "/graph", "store:index", "store:graph"} {
		eventually(t, admin, "the stage "+id, stage(id)+` !== null`, 20*time.Second)
	}
	eventually(t, admin, "a rate at the writer", stage("writer:writer")+`.querySelector('.rate').textContent.endsWith('documents/s')`, 10*time.Second)
	eventually(t, admin, "both stores proven in agreement",
		`[...document.querySelectorAll('#agreement-stores tbody tr')].filter(r => r.cells[1].textContent.startsWith('100.0%') && r.cells[2].textContent === '1500').length === 2`, 60*time.Second)

	// A poison message: a producer's document the writer can never
	// store, dead-lettered by its ingest consumer with the reason.
	js := jsOf(t, s, s.NATSAuth(natsauth.UserProducer))
	if _, err := js.Publish(ctx, contract.IngestSubject("doc-0007"), []byte(`{"key":"doc-0007","version":-1,"title":"Doc","body":"a poison"}`)); err != nil {
		t.Fatal(err)
	}
	poison := `document.querySelector('#deadletters tr.deadletter[data-consumer="ingest"]')`
	eventually(t, admin, "the poison message among the ingest consumer's dead letters, with its reason and payload",
		poison+` !== null && `+poison+`.textContent.includes('doc-0007') && `+poison+`.querySelector('.reason').textContent.length > 10`, 20*time.Second)
	eventually(t, admin, "the ingest consumer's stage marked with its dead letters", `document.querySelector('#picture g[data-stage^="consumer:`+writer.IngestStream+`/"]').dataset.state === 'dead_letters'`, 10*time.Second)
	var reason string
	if err := chromedp.Run(admin, chromedp.Evaluate(poison+`.querySelector('.reason').textContent`, &reason)); err != nil {
		t.Fatal(err)
	}
	t.Logf("dead letter's reason: %s", reason)
	screenshot(t, admin, shots, "dead-letters.png", "#deadletters")

	// The read token sees them, with no redrive button, and the API
	// refuses its redrive anyway.
	var none []string
	reader := tab(t, bctx, consoleURL, readToken, &none, &mu)
	eventually(t, reader, "the dead letters to a read token", `document.querySelectorAll('#deadletters tr.deadletter').length >= 1`, 10*time.Second)
	var buttons int
	var who string
	if err := chromedp.Run(reader, chromedp.Evaluate(`document.querySelectorAll('button.redrive').length`, &buttons), chromedp.Text("#who", &who, chromedp.ByID)); err != nil {
		t.Fatal(err)
	}
	if buttons != 0 || !strings.Contains(who, "read only") {
		t.Errorf("a read token sees %d redrive buttons, and %q", buttons, who)
	}
	var seq uint64
	if err := chromedp.Run(admin, chromedp.Evaluate(poison+`.dataset.seq * 1`, &seq)); err != nil {
		t.Fatal(err)
	}
	req, err := http.NewRequestWithContext(ctx, http.MethodPost, "http://"+consoleAddr+strings.Replace(console.RedrivePath, "{consumer}", "ingest", 1),
		strings.NewReader(fmt.Sprintf(`{"seqs":[%d]}`, seq)))
	if err != nil {
		t.Fatal(err)
	}
	auth.SetBearer(req.Header, readToken)
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	_ = resp.Body.Close()
	if resp.StatusCode != http.StatusForbidden {
		t.Errorf("a redrive with a read token: %s, want 403", resp.Status)
	}
	screenshot(t, reader, shots, "read-only.png", "#deadletters")

	// Redriven from the page, once confirmed: republished to the writer,
	// which dead-letters it again (its cause is in its data), under a
	// new sequence.
	button := fmt.Sprintf(`button.redrive[data-consumer="ingest"][data-seq="%d"]`, seq)
	if err := chromedp.Run(admin, chromedp.WaitVisible(button, chromedp.ByQuery), chromedp.Click(button, chromedp.ByQuery)); err != nil {
		t.Fatal(err)
	}
	eventually(t, admin, "the redrive's result", `document.getElementById('redrive-result').textContent.includes('redriven (republish')`, 20*time.Second)
	eventually(t, admin, "the redriven dead letter gone, and back under a new sequence",
		fmt.Sprintf(`document.querySelector('#deadletters tr.deadletter[data-consumer="ingest"][data-seq="%d"]') === null && `, seq)+
			poison+` !== null && `+poison+`.textContent.includes('doc-0007')`, 20*time.Second)
	mu.Lock()
	if len(confirmed) != 1 || !strings.Contains(confirmed[0], fmt.Sprintf("#%d of ingest", seq)) {
		t.Errorf("confirmations asked: %q", confirmed)
	}
	mu.Unlock()
	q, err := deadletter.Open(ctx, jsOf(t, s, s.OperatorNATS))
	if err != nil {
		t.Fatal(err)
	}
	if p, err := q.Read(ctx, "ingest", 0); err != nil || p.Total != 1 || p.DeadLetters[0].Seq == seq {
		t.Errorf("the ingest consumer's dead letters after the redrive: %+v (%v)", p, err)
	}

	// A rebuild of the index while documents are being rewritten: its
	// progress moves on the page.
	rewritten := make(chan error, 1)
	go func() {
		_, err := wc.Batch(ctx, func(yield func(client.Write) bool) {
			for i := 100; i < 700; i++ {
				if !yield(client.Write{Doc: client.Document{Key: fmt.Sprintf("doc-%04d", i), Version: 2, Title: "Doc", Body: para + " Rewritten.",
					Links: []string{"doc-0000"}, Tags: []string{"t"}}}) {
					return
				}
			}
		}, func(client.LineResult) error { return nil })
		rewritten <- err
	}()
	rc := &rebuild.Client{Addr: cfg.IndexAddr, Token: s.OperatorToken}
	st, _, err := rc.Start(ctx)
	if err != nil {
		t.Fatal(err)
	}
	rebuilt := time.Now()
	row := `document.querySelector('#rebuild-rows tr[data-projector="index"]')`
	seen := map[string]bool{}
	shot := false
	deadline := time.Now().Add(60 * time.Second)
	for {
		var state string
		if err := chromedp.Run(admin, chromedp.Evaluate(row+` === null ? '' : `+row+`.dataset.phase + ' ' + `+row+`.dataset.applied + ' ' + `+row+`.dataset.last`, &state)); err != nil {
			t.Fatal(err)
		}
		if state != "" {
			seen[state] = true
			if !shot && strings.HasPrefix(state, rebuild.PhaseFilling) {
				screenshot(t, admin, shots, "rebuild.png", "#rebuilds")
				screenshot(t, admin, shots, "pipeline.png", "#pipeline")
				shot = true
			}
		}
		if strings.HasPrefix(state, rebuild.PhaseDone) || time.Now().After(deadline) {
			break
		}
		time.Sleep(50 * time.Millisecond)
	}
	t.Logf("rebuild took %s", time.Since(rebuilt).Round(10*time.Millisecond))
	if err := <-rewritten; err != nil {
		t.Fatal(err)
	}
	t.Logf("rebuild %s as the page showed it (phase applied last): %v", st.ID, slices.Sorted(func(yield func(string) bool) {
		for k := range seen {
			if !yield(k) {
				return
			}
		}
	}))
	// At least two positions short of the stream's end, then done.
	applied, done := map[string]bool{}, false
	for k := range seen {
		parts := strings.Fields(k)
		switch {
		case len(parts) == 3 && parts[0] == rebuild.PhaseDone:
			done = true
		case len(parts) == 3 && parts[1] != parts[2]:
			applied[parts[1]] = true
		}
	}
	if len(applied) < 2 || !done {
		t.Errorf("the page did not show the rebuild's progress move to its end: %v", seen)
	}

	// A document damaged in the graph: named as a difference, then
	// repaired.
	g := graphView(t, s, "doc-0003")
	if len(g.Chunks) < 2 {
		t.Fatalf("doc-0003 has %d chunks: the test needs several", len(g.Chunks))
	}
	g.Chunks, g.Repair = g.Chunks[:1], true
	damageGraph(t, s, g)
	diff := `document.querySelector('#differences tr.difference[data-key="doc-0003"]')`
	eventually(t, admin, "the damaged document as a difference", diff+` !== null && `+diff+`.dataset.store === 'graph'`, 30*time.Second)
	eventually(t, admin, "the graph's stage marked as differing", stage("store:graph")+`.dataset.state === 'differs'`, 5*time.Second)
	screenshot(t, admin, shots, "difference.png", "#agreement")
	eventually(t, admin, "the difference repaired and the graph proven whole again",
		diff+` === null && [...document.querySelectorAll('#agreement-stores tbody tr')].filter(r => r.cells[1].textContent.startsWith('100.0%') && r.cells[5].textContent === '0').length === 2`, 60*time.Second)
	var full []byte
	if err := chromedp.Run(admin, chromedp.FullScreenshot(&full, 100)); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(filepath.Join(shots, "console.png"), full, 0o644); err != nil {
		t.Fatal(err)
	}
	t.Logf("done after %s; screenshots in %s", time.Since(began).Round(100*time.Millisecond), shots)
}

// jsOf is the JetStream of s as user.
func jsOf(t *testing.T, s *stack.Stack, user natsauth.ClientConfig) jetstream.JetStream {
	t.Helper()
	opts, err := user.Options()
	if err != nil {
		t.Fatal(err)
	}
	nc, err := nats.Connect(s.NATSURL, opts...)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(nc.Close)
	js, err := jetstream.New(nc)
	if err != nil {
		t.Fatal(err)
	}
	return js
}
