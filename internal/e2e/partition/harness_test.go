//go:build linux

package partition_test

import (
	"bufio"
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"math/rand/v2"
	"net/http"
	"net/url"
	"os"
	"os/exec"
	"slices"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/nats-io/nats.go/jetstream"

	"github.com/converge-sync/converge/internal/auth"
	"github.com/converge-sync/converge/internal/config"
	"github.com/converge-sync/converge/internal/indexprojector"
	"github.com/converge-sync/converge/internal/lease"
	"github.com/converge-sync/converge/internal/natsauth"
	"github.com/converge-sync/converge/internal/netfault"
	"github.com/converge-sync/converge/internal/proc"
	"github.com/converge-sync/converge/internal/stack"
	"github.com/converge-sync/converge/internal/testenv"
)

// credentialVars carry a credential: no child inherits them from the
// test's environment, each gets its own alone.
var credentialVars = []string{
	config.EnvPostgresURL, config.EnvPostgresURL + "_FILE", "PGPASSWORD", "PGPASSFILE",
	natsauth.EnvUser, natsauth.EnvPassword, natsauth.EnvPassword + "_FILE", natsauth.EnvCreds, natsauth.EnvNKey,
	auth.EnvToken, auth.EnvToken + "_FILE", auth.EnvTokensFile,
	"CONVERGE_NEO4J_PASSWORD", indexprojector.EnvQdrantAPIKey, "CONVERGE_WEBHOOK_SECRET",
}

// instance is one of the two processes of a service. Its NATS link goes
// through a proxy of its own, and so does its store link (a projector's):
// the test cuts the one and freezes the other's answers, while both ends
// of each keep running.
type instance struct {
	t     *testing.T
	name  string // "a" or "b"
	bin   string
	args  []string
	env   []string
	addr  string          // its metrics address: /metrics, /readyz, verify's digests
	nats  *netfault.Proxy // between it and NATS
	store *netfault.Proxy // between it and its store; nil for the notifier
	wire  storeWire       // what crosses store; nil for the notifier
	logs  testenv.Buffer

	mu    sync.Mutex
	child *proc.Child
}

func (in *instance) start() {
	in.t.Helper()
	c, err := proc.Start(in.bin, in.args, proc.Options{Env: in.env, Unset: credentialVars, Out: &in.logs})
	if err != nil {
		in.t.Fatalf("start %s: %v", in.name, err)
	}
	in.mu.Lock()
	in.child = c
	in.mu.Unlock()
}

// kill SIGKILLs the process (its end of the test).
func (in *instance) kill() {
	in.mu.Lock()
	c := in.child
	in.child = nil
	in.mu.Unlock()
	if c != nil {
		c.Kill()
	}
}

func (in *instance) pid() int {
	in.mu.Lock()
	defer in.mu.Unlock()
	if in.child == nil {
		return 0
	}
	return in.child.Pid()
}

// exited reports an exit of the process (none is expected).
func (in *instance) exited() error {
	in.mu.Lock()
	defer in.mu.Unlock()
	if in.child != nil && in.child.Exited() {
		return fmt.Errorf("%s exited: %w", in.name, in.child.Err())
	}
	return nil
}

func (in *instance) ready() bool { return stack.HTTPOK("http://" + in.addr + "/readyz") }

// holds reports whether holder, a lease's Holder, names this instance:
// the host and its metrics address (projector.ServiceConfig's default).
func (in *instance) holds(holder string) bool { return strings.HasSuffix(holder, "/"+in.addr) }

// metric is the value of the series (its name and labels, as /metrics
// prints them), -1 when it cannot be read.
func (in *instance) metric(series string) float64 {
	c := http.Client{Timeout: 2 * time.Second}
	resp, err := c.Get("http://" + in.addr + "/metrics")
	if err != nil {
		return -1
	}
	defer resp.Body.Close()
	sc := bufio.NewScanner(resp.Body)
	sc.Buffer(make([]byte, 64*1024), 1024*1024)
	for sc.Scan() {
		if v, ok := strings.CutPrefix(sc.Text(), series+" "); ok {
			f, err := strconv.ParseFloat(v, 64)
			if err != nil {
				return -1
			}
			return f
		}
	}
	return -1
}

// logLine is one line of a service's JSON log.
type logLine struct {
	Time time.Time `json:"time"`
	Msg  string    `json:"msg"`
	Err  string    `json:"err"`
}

// logLines is the lines of the instance's log whose message is msg.
func (in *instance) logLines(msg string) []logLine {
	var out []logLine
	for line := range strings.Lines(in.logs.String()) {
		var l logLine
		if json.Unmarshal([]byte(line), &l) == nil && l.Msg == msg {
			out = append(out, l)
		}
	}
	return out
}

// term is one taking of a lease: by whom and when, as NATS stored it.
type term struct {
	Holder, Incarnation string
	At                  time.Time
}

// leaseWatch follows a lease's key in the leases' bucket: every term, and
// the last renewal of each.
type leaseWatch struct {
	mu      sync.Mutex
	terms   []term
	renewed time.Time // the last write of the current term
}

// watchLease follows the lease name on js until t ends.
func watchLease(t *testing.T, js jetstream.JetStream, name string) *leaseWatch {
	t.Helper()
	ctx, cancel := context.WithCancel(context.Background())
	t.Cleanup(cancel)
	// The bucket, as the services make it.
	if _, err := lease.Open(ctx, js, lease.Config{Name: name}, nil); err != nil {
		t.Fatal(err)
	}
	kv, err := js.KeyValue(ctx, lease.Bucket)
	if err != nil {
		t.Fatal(err)
	}
	w, err := kv.Watch(ctx, name)
	if err != nil {
		t.Fatal(err)
	}
	lw := &leaseWatch{}
	go func() {
		defer func() { _ = w.Stop() }()
		for e := range w.Updates() {
			if e == nil || e.Operation() != jetstream.KeyValuePut {
				continue
			}
			var v lease.Value
			if json.Unmarshal(e.Value(), &v) != nil {
				continue
			}
			lw.mu.Lock()
			if n := len(lw.terms); n == 0 || lw.terms[n-1].Incarnation != v.Incarnation {
				lw.terms = append(lw.terms, term{Holder: v.Holder, Incarnation: v.Incarnation, At: e.Created()})
			}
			lw.renewed = e.Created()
			lw.mu.Unlock()
		}
	}()
	return lw
}

// current is the current term (ok false: none yet).
func (lw *leaseWatch) current() (term, bool) {
	lw.mu.Lock()
	defer lw.mu.Unlock()
	if len(lw.terms) == 0 {
		return term{}, false
	}
	return lw.terms[len(lw.terms)-1], true
}

// lastRenewal is when the current term last wrote the key.
func (lw *leaseWatch) lastRenewal() time.Time {
	lw.mu.Lock()
	defer lw.mu.Unlock()
	return lw.renewed
}

// all is every term so far.
func (lw *leaseWatch) all() []term {
	lw.mu.Lock()
	defer lw.mu.Unlock()
	return slices.Clone(lw.terms)
}

// load writes new versions of documents through the writer's API: each
// producer owns a share of the keys, so that its versions of a document
// only grow, and retries a write until it is acknowledged.
type load struct {
	api       string
	docs      int
	producers int
	rate      float64 // writes per second, all producers together
	seed      uint64

	acked    atomic.Int64
	failures atomic.Int64
}

func docKey(i int) string { return fmt.Sprintf("doc/%04d", i) }

// run writes until ctx ends.
func (l *load) run(ctx context.Context) {
	var wg sync.WaitGroup
	for p := range l.producers {
		wg.Go(func() { l.produce(ctx, p) })
	}
	wg.Wait()
}

func (l *load) produce(ctx context.Context, p int) {
	rng := rand.New(rand.NewPCG(l.seed, uint64(p)+1))
	var keys []int
	for i := p; i < l.docs; i += l.producers {
		keys = append(keys, i)
	}
	versions := map[int]int64{}
	client := &http.Client{Timeout: 10 * time.Second}
	pace := time.Duration(float64(time.Second) * float64(l.producers) / l.rate)
	tick := time.NewTicker(pace)
	defer tick.Stop()
	for {
		select {
		case <-ctx.Done():
			return
		case <-tick.C:
		}
		i := keys[rng.IntN(len(keys))]
		versions[i]++
		for ctx.Err() == nil {
			if err := l.put(ctx, client, i, versions[i]); err == nil {
				l.acked.Add(1)
				break
			}
			if ctx.Err() != nil {
				return
			}
			l.failures.Add(1)
			time.Sleep(50 * time.Millisecond)
		}
	}
}

// put writes version v of document i: a function of both alone, so that
// a retry sends the same content.
func (l *load) put(ctx context.Context, client *http.Client, i int, v int64) error {
	doc := map[string]any{
		"version": v,
		"title":   fmt.Sprintf("Document %d, version %d", i, v),
		"body": fmt.Sprintf("Paragraph one of document %d at version %d.\n\nParagraph two, %s.\n\nParagraph three: %s.",
			i, v, strings.Repeat("words ", 20+int(v%30)), strings.Repeat("more ", 10+i%20)),
		"links": []string{docKey((i + 1) % l.docs), docKey((i*7 + int(v)) % l.docs)},
		"tags":  []string{fmt.Sprint("t", i%5), fmt.Sprint("v", v%3)},
	}
	b, _ := json.Marshal(doc)
	req, err := http.NewRequestWithContext(ctx, http.MethodPut, l.api+"/v1/documents/"+url.PathEscape(docKey(i)), bytes.NewReader(b))
	if err != nil {
		return err
	}
	req.Header.Set("Content-Type", "application/json")
	resp, err := client.Do(req)
	if err != nil {
		return err
	}
	defer resp.Body.Close()
	if resp.StatusCode != http.StatusOK {
		return fmt.Errorf("PUT %s v%d: %s", docKey(i), v, resp.Status)
	}
	return nil
}

// startLoad starts l; the returned function stops it and waits until it
// has stopped (it may be called again).
func startLoad(l *load) (stop func()) {
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan struct{})
	go func() { defer close(done); l.run(ctx) }()
	return func() { cancel(); <-done }
}

// drained waits until the consumer has nothing left to deliver and
// nothing awaiting an acknowledgement.
func drained(t *testing.T, js jetstream.JetStream, stream, consumer string, timeout time.Duration) {
	t.Helper()
	testenv.Eventually(t, consumer+" to apply everything", timeout, func() bool {
		ctx, cancel := context.WithTimeout(context.Background(), 2*time.Second)
		defer cancel()
		c, err := js.Consumer(ctx, stream, consumer)
		if err != nil {
			return false
		}
		info, err := c.Info(ctx)
		return err == nil && info.NumPending == 0 && info.NumAckPending == 0
	})
}

// runConverge runs the converge CLI with env (its credentials) added to
// the test's environment without its credentials.
func runConverge(ctx context.Context, bin string, env []string, args ...string) (string, error) {
	cmd := exec.CommandContext(ctx, bin, args...)
	for _, kv := range os.Environ() {
		if name, _, _ := strings.Cut(kv, "="); !slices.Contains(credentialVars, name) {
			cmd.Env = append(cmd.Env, kv)
		}
	}
	cmd.Env = append(cmd.Env, env...)
	out, err := cmd.CombinedOutput()
	return string(out), err
}

// firstAfter polls f every 20 ms from now until it returns true or stop
// is closed, and returns when it first did (zero: never).
func firstAfter(f func() bool, stop <-chan struct{}) <-chan time.Time {
	at := make(chan time.Time, 1)
	go func() {
		tick := time.NewTicker(20 * time.Millisecond)
		defer tick.Stop()
		for {
			if f() {
				at <- time.Now()
				return
			}
			select {
			case <-stop:
				at <- time.Time{}
				return
			case <-tick.C:
			}
		}
	}()
	return at
}

// rel is t relative to ref, signed, in milliseconds ("-" when t is zero).
func rel(t, ref time.Time) string {
	if t.IsZero() {
		return "-"
	}
	d := t.Sub(ref).Round(time.Millisecond)
	if d >= 0 {
		return "+" + d.String()
	}
	return d.String()
}
