package neo4j

import (
	"context"
	"errors"
	"fmt"
	"io"
	"net"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/neo4j/neo4j-go-driver/v5/neo4j"
)

func TestNextAction(t *testing.T) {
	const name = "converge_tag_name"
	for _, c := range []struct {
		ix   schemaIndex
		want schemaAction
	}{
		{schemaIndex{}, actionCreate},
		{schemaIndex{found: true, owner: name, state: indexOnline, percent: 100}, actionDone},
		{schemaIndex{found: true, owner: name, state: indexPopulating, percent: 40}, actionAwait},
		{schemaIndex{found: true, owner: name, state: indexFailed}, actionRecreate},
		{schemaIndex{found: true, state: indexOnline, percent: 100}, actionDropOrphan},
		{schemaIndex{found: true, state: indexFailed}, actionDropOrphan},
		{schemaIndex{found: true, state: indexPopulating, percent: 100}, actionDropOrphan},
		{schemaIndex{found: true, owner: "another", state: indexOnline}, actionForeign},
	} {
		if got := nextAction(name, c.ix); got != c.want {
			t.Errorf("nextAction(%+v) = %v, want %v", c.ix, got, c.want)
		}
	}
}

// settled is the schema Ensure leaves: every constraint with its index
// online.
func settled() map[string]modelIndex {
	out := map[string]modelIndex{}
	for _, c := range constraints {
		out[c.name] = modelIndex{owner: c.name, state: indexOnline, percent: 100}
	}
	return out
}

// schemaSteps are the statements of the committed write transactions,
// which Ensure sends one per transaction.
func schemaSteps(t *testing.T, r *fakeRunner) []string {
	t.Helper()
	var out []string
	for _, calls := range r.committed() {
		if len(calls) != 1 {
			t.Fatalf("a schema transaction ran %s", names(calls))
		}
		out = append(out, calls[0].name)
	}
	return out
}

// On a database without the schema, Ensure creates each constraint in a
// transaction of its own; on one that has it, it only reads; data that
// violates a constraint fails it at once.
func TestEnsureRunsEachStepInItsOwnTransaction(t *testing.T) {
	r := newFakeRunner()
	b := newTestBackend(r, 100)
	if err := b.Ensure(ctx()); err != nil {
		t.Fatal(err)
	}
	if got := fmt.Sprint(schemaSteps(t, r)); got != "[ensureDocumentKey ensureChunkID ensureTagName]" {
		t.Fatalf("Ensure ran %v", got)
	}
	if fmt.Sprint(r.graph.indexes) != fmt.Sprint(settled()) {
		t.Fatalf("indexes %v", r.graph.indexes)
	}
	// Once settled, Ensure only reads.
	r.attempts = nil
	if err := b.Ensure(ctx()); err != nil {
		t.Fatal(err)
	}
	if steps := schemaSteps(t, r); len(steps) != 0 {
		t.Fatalf("a second Ensure ran %v", steps)
	}

	// Data that violates a constraint fails Ensure at once, permanently.
	r = newFakeRunner()
	r.fail = func(_, _ int, name string) error {
		if name == "ensureChunkID" {
			return &neo4j.Neo4jError{Code: codeConstraintValidationFailed}
		}
		return nil
	}
	err := newTestBackend(r, 100).Ensure(ctx())
	var e *Error
	if !errors.As(err, &e) || !e.Permanent() || e.Op != "ensure" || !strings.Contains(err.Error(), "ensureChunkID") {
		t.Fatalf("err = %v", err)
	}
	if n := strings.Count(names(slices.Concat(attemptCalls(r)...)), "ensureChunkID"); n != 1 {
		t.Fatalf("ensureChunkID sent %d times, want once", n)
	}
}

func attemptCalls(r *fakeRunner) [][]call {
	var out [][]call
	for _, a := range r.attempts {
		out = append(out, a.calls)
	}
	return out
}

// Ensure converges from each state of the schema that a process stopped
// while making it, or another instance making it meanwhile, leaves: it
// takes the steps each calls for, and no other.
func TestEnsureConvergesFromEveryStateACrashLeaves(t *testing.T) {
	const tag = "converge_tag_name"
	for _, c := range []struct {
		name  string
		index modelIndex // converge_tag_name's, the others settled
		setup func(r *fakeRunner)
		steps string // the schema transactions committed
	}{
		{name: "none", steps: "[ensureTagName]"},
		{name: "settled", index: modelIndex{owner: tag, state: indexOnline, percent: 100}, steps: "[]"},
		{name: "orphan online", index: modelIndex{state: indexOnline, percent: 100}, steps: "[dropIndex ensureTagName]"},
		{name: "orphan failed", index: modelIndex{state: indexFailed}, steps: "[dropIndex ensureTagName]"},
		{name: "orphan populating", index: modelIndex{state: indexPopulating, percent: 100}, steps: "[dropIndex ensureTagName]"},
		{name: "constraint index failed", index: modelIndex{owner: tag, state: indexFailed}, steps: "[dropConstraint ensureTagName]"},
		{name: "constraint index populating", index: modelIndex{owner: tag, state: indexPopulating, percent: 60},
			setup: func(r *fakeRunner) { r.graph.awaitOnline = true }, steps: "[awaitIndex]"},
		// Another instance's creation commits before the drop (Ensure's
		// transactions 1 and 2 find the other constraints settled, 3
		// reads the index, 4 drops it): Neo4j refuses to drop the
		// constraint's index, and the next look finds it settled.
		{name: "another instance's creation commits", index: modelIndex{state: indexPopulating, percent: 100},
			setup: func(r *fakeRunner) {
				txs := 0
				r.between = func(g *modelGraph) {
					if txs++; txs == 4 {
						g.indexes[tag] = modelIndex{owner: tag, state: indexOnline, percent: 100}
					}
				}
			}, steps: "[]"},
		// It rolls back: the server drops the index it made.
		{name: "another instance's creation rolls back", index: modelIndex{state: indexPopulating, percent: 100},
			setup: func(r *fakeRunner) {
				txs := 0
				r.between = func(g *modelGraph) {
					if txs++; txs == 4 {
						delete(g.indexes, tag)
					}
				}
			}, steps: "[dropIndex ensureTagName]"},
	} {
		t.Run(c.name, func(t *testing.T) {
			r := newFakeRunner()
			r.graph.indexes = settled()
			delete(r.graph.indexes, tag)
			if c.index != (modelIndex{}) {
				r.graph.indexes[tag] = c.index
			}
			if c.setup != nil {
				c.setup(r)
			}
			if err := newTestBackend(r, 100).Ensure(ctx()); err != nil {
				t.Fatal(err)
			}
			var steps []string
			for _, a := range r.attempts {
				if a.write && a.committed {
					steps = append(steps, a.calls[0].name)
				}
			}
			if got := fmt.Sprint(steps); got != c.steps {
				t.Errorf("steps %s, want %s", got, c.steps)
			}
			if fmt.Sprint(r.graph.indexes) != fmt.Sprint(settled()) {
				t.Errorf("indexes %v, want %v", r.graph.indexes, settled())
			}
		})
	}
}

// A constraint whose index stays populating fails Ensure after
// Config.SchemaWait, naming the state; an index of the name that another
// constraint owns fails it at once.
func TestEnsureGivesUp(t *testing.T) {
	const tag = "converge_tag_name"
	for _, c := range []struct {
		name  string
		index modelIndex
		want  string
		quick bool
	}{
		{name: "populating", index: modelIndex{owner: tag, state: indexPopulating, percent: 30},
			want: "not settled within 200ms: index converge_tag_name of the constraint is POPULATING (30%): awaitIndex:"},
		{name: "foreign", index: modelIndex{owner: "operators_tag", state: indexOnline}, quick: true,
			want: "index converge_tag_name: the index belongs to another constraint operators_tag"},
	} {
		t.Run(c.name, func(t *testing.T) {
			r := newFakeRunner()
			r.graph.indexes = settled()
			r.graph.indexes[tag] = c.index
			b := newTestBackend(r, 100)
			b.cfg.SchemaWait = 200 * time.Millisecond
			start := time.Now()
			err := b.Ensure(ctx())
			if err == nil || !strings.Contains(err.Error(), c.want) || !strings.Contains(err.Error(), "ensureTagName") {
				t.Fatalf("err = %v, want one containing %q", err, c.want)
			}
			if took := time.Since(start); c.quick != (took < b.cfg.SchemaWait) {
				t.Fatalf("failed after %v (SchemaWait %v)", took, b.cfg.SchemaWait)
			}
			if r.graph.indexes[tag] != c.index {
				t.Fatalf("the index changed to %+v", r.graph.indexes[tag])
			}
		})
	}
}

// query runs cypher on b's database in a transaction of its own.
func query(t *testing.T, b *Backend, cypher string, params map[string]any) []record {
	t.Helper()
	res, err := neo4j.ExecuteQuery(ctx(), b.driver, cypher, params, neo4j.EagerResultTransformer,
		neo4j.ExecuteQueryWithDatabase(b.cfg.Database))
	if err != nil {
		t.Fatalf("%s: %v", cypher, err)
	}
	out := make([]record, len(res.Records))
	for i, r := range res.Records {
		out[i] = r.AsMap()
	}
	return out
}

// serverIndexes is what the server holds of the constraints' indexes:
// "name owner state" each, sorted.
func serverIndexes(t *testing.T, b *Backend) string {
	t.Helper()
	var names []string
	for _, c := range constraints {
		names = append(names, c.name)
	}
	var out []string
	for _, r := range query(t, b, cypherShowIndexes, map[string]any{"names": names}) {
		out = append(out, fmt.Sprintf("%v %v %v", r["name"], r["owningConstraint"], r["state"]))
	}
	slices.Sort(out)
	return strings.Join(out, ", ")
}

const settledOnServer = "converge_chunk_id converge_chunk_id ONLINE, converge_document_key converge_document_key ONLINE, " +
	"converge_tag_name converge_tag_name ONLINE"

// dropSchema removes the constraints and any index of their names.
func dropSchema(t *testing.T, b *Backend) {
	t.Helper()
	for _, c := range constraints {
		query(t, b, cypherDropConstraint, map[string]any{"name": c.name})
		query(t, b, cypherDropIndex, map[string]any{"name": c.name})
	}
}

// An index that has the name of a constraint but no constraint (what a
// projector SIGKILLed while it created the constraint left behind):
// CREATE CONSTRAINT ... IF NOT EXISTS fails on it with
// Neo.ClientError.Schema.IndexWithNameAlreadyExists on every attempt, so
// an Ensure that only sent it never passed again. Ensure drops the index
// and creates the constraint.
func TestEnsureDropsAnIndexWithoutItsConstraint(t *testing.T) {
	b := newServerBackend(t, Config{})
	dropSchema(t, b)
	query(t, b, `CREATE INDEX converge_tag_name FOR (n:Tag) ON (n.name)`, nil)
	if err := b.Ensure(ctx()); err != nil {
		t.Fatal(err)
	}
	if got := serverIndexes(t, b); got != settledOnServer {
		t.Fatalf("after Ensure: %s", got)
	}
}

// A uniqueness constraint of the operator's on Tag.name, under another
// name, stands for converge_tag_name: CREATE CONSTRAINT ... IF NOT EXISTS
// does nothing, and Ensure settles instead of creating it again and again.
func TestEnsureTakesAnEquivalentConstraint(t *testing.T) {
	b := newServerBackend(t, Config{SchemaWait: 5 * time.Second})
	dropSchema(t, b)
	query(t, b, `CREATE CONSTRAINT operators_tag FOR (n:Tag) REQUIRE n.name IS UNIQUE`, nil)
	t.Cleanup(func() {
		query(t, b, `DROP CONSTRAINT operators_tag IF EXISTS`, nil)
		if err := b.Ensure(ctx()); err != nil {
			t.Error(err)
		}
	})
	if err := b.Ensure(ctx()); err != nil {
		t.Fatal(err)
	}
	want := "converge_chunk_id converge_chunk_id ONLINE, converge_document_key converge_document_key ONLINE"
	if got := serverIndexes(t, b); got != want {
		t.Fatalf("after Ensure: %s; want %s", got, want)
	}
}

// While another instance's creation of a constraint runs (its
// transaction open), the constraint's index is POPULATING without an
// owner, as the index a creation cut short leaves. Ensure drops such an
// index; this pins the server's side of why that is safe: the drop waits
// for the creation's schema lock, and then fails on the committed
// constraint's index (or finds nothing, after a rollback), so the other
// instance's creation is never undone.
func TestEnsureLeavesAConcurrentCreationAlone(t *testing.T) {
	b := newServerBackend(t, Config{})
	for _, commit := range []bool{true, false} {
		t.Run(map[bool]string{true: "commit", false: "rollback"}[commit], func(t *testing.T) {
			dropSchema(t, b)
			session := b.driver.NewSession(ctx(), neo4j.SessionConfig{DatabaseName: b.cfg.Database})
			defer session.Close(ctx())
			other, err := session.BeginTransaction(ctx())
			if err != nil {
				t.Fatal(err)
			}
			res, err := other.Run(ctx(), cypherConstraintTagName, nil)
			if err == nil {
				_, err = res.Consume(ctx())
			}
			if err != nil {
				t.Fatal(err)
			}
			if got := serverIndexes(t, b); got != "converge_tag_name <nil> POPULATING" {
				t.Fatalf("during the other creation: %s", got)
			}
			done := make(chan error, 1)
			go func() { done <- b.Ensure(ctx()) }()
			select {
			case err := <-done:
				t.Fatalf("Ensure returned %v during the other creation", err)
			case <-time.After(time.Second):
			}
			if commit {
				err = other.Commit(ctx())
			} else {
				err = other.Rollback(ctx())
			}
			if err != nil {
				t.Fatalf("the other creation's end: %v", err)
			}
			select {
			case err := <-done:
				if err != nil {
					t.Fatal(err)
				}
			case <-time.After(20 * time.Second):
				t.Fatal("Ensure did not return within 20s of the other creation's end")
			}
			if got := serverIndexes(t, b); got != settledOnServer {
				t.Fatalf("after Ensure: %s", got)
			}
		})
	}
}

// Instances starting together all settle the schema.
func TestEnsureConcurrently(t *testing.T) {
	b := newServerBackend(t, Config{})
	dropSchema(t, b)
	var wg sync.WaitGroup
	errs := make([]error, 4)
	for i := range errs {
		other, err := New(ctx(), b.cfg)
		if err != nil {
			t.Fatal(err)
		}
		defer other.Close()
		wg.Add(1)
		go func() {
			defer wg.Done()
			errs[i] = other.Ensure(ctx())
		}()
	}
	wg.Wait()
	if err := errors.Join(errs...); err != nil {
		t.Fatal(err)
	}
	if got := serverIndexes(t, b); got != settledOnServer {
		t.Fatalf("after Ensure: %s", got)
	}
}

// cutProxy forwards TCP connections to a server until cut, which closes
// every connection at once, as the kernel does for a process SIGKILLed.
type cutProxy struct {
	ln    net.Listener
	mu    sync.Mutex
	conns []net.Conn
}

func startCutProxy(t *testing.T, target string) *cutProxy {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	p := &cutProxy{ln: ln}
	go func() {
		for {
			c, err := ln.Accept()
			if err != nil {
				return
			}
			s, err := net.Dial("tcp", target)
			if err != nil {
				_ = c.Close()
				continue
			}
			p.mu.Lock()
			p.conns = append(p.conns, c, s)
			p.mu.Unlock()
			go func() { _, _ = io.Copy(s, c); _ = s.Close() }()
			go func() { _, _ = io.Copy(c, s); _ = c.Close() }()
		}
	}()
	return p
}

func (p *cutProxy) cut() {
	_ = p.ln.Close()
	p.mu.Lock()
	defer p.mu.Unlock()
	for _, c := range p.conns {
		if tc, ok := c.(*net.TCPConn); ok {
			_ = tc.SetLinger(0) // a reset, as after a SIGKILL
		}
		_ = c.Close()
	}
}

// A process whose connection dies while it creates the constraints (a
// SIGKILL) leaves, now and then, an index POPULATING without its
// constraint and without any transaction creating it, for good: the
// state in which a graph projector SIGKILLed by
// TestGraphProjectorSurvivesSIGKILL could not start again. Neo4j 5.26
// leaves it after a few of every twenty connections cut 5 to 60 ms into
// the creation. Each round here cuts one at another moment (12 at most,
// ending after two that left that state) and requires the next Ensure to
// settle.
func TestEnsureAfterACreationCutShort(t *testing.T) {
	b := newServerBackend(t, Config{})
	target := strings.TrimPrefix(b.cfg.URL, "bolt://")
	orphans := 0
	rounds := 0
	for ; rounds < 12 && orphans < 2; rounds++ {
		dropSchema(t, b)
		p := startCutProxy(t, target)
		cfg := b.cfg
		cfg.URL = "bolt://" + p.ln.Addr().String()
		cut, err := New(ctx(), cfg)
		if err != nil {
			t.Fatal(err)
		}
		cutCtx, cancel := context.WithCancel(ctx())
		ended := make(chan struct{})
		go func() { // what a process creating the constraints sends
			defer close(ended)
			for _, c := range constraints {
				if cut.schemaWrite(cutCtx, c.create) != nil {
					return
				}
			}
		}()
		time.Sleep(time.Duration(5+rounds%12*5) * time.Millisecond)
		p.cut()
		cancel()
		<-ended
		_ = cut.Close()
		// The state the cut left, once the server has ended the cut
		// transaction.
		time.Sleep(200 * time.Millisecond)
		left := serverIndexes(t, b)
		// (The text searched for is a parameter, or this query would
		// find itself.)
		if strings.Contains(left, "<nil> POPULATING") && len(query(t, b, `SHOW TRANSACTIONS YIELD currentQuery
WHERE currentQuery CONTAINS $create RETURN currentQuery`, map[string]any{"create": "CREATE CONSTRAINT"})) == 0 {
			orphans++
			t.Logf("round %d: the cut left %s", rounds, left)
		}
		start := time.Now()
		if err := b.Ensure(ctx()); err != nil {
			t.Fatalf("round %d: Ensure after the cut left %s: %v", rounds, left, err)
		}
		if got := serverIndexes(t, b); got != settledOnServer {
			t.Fatalf("round %d: after Ensure: %s", rounds, got)
		}
		if took := time.Since(start); took > 10*time.Second {
			t.Errorf("round %d: Ensure took %v after the cut left %s", rounds, took, left)
		}
	}
	t.Logf("%d rounds; %d left an index without its constraint and without a creator", rounds, orphans)
}
