package neo4j

import (
	"fmt"
	"strings"
	"testing"

	"github.com/neo4j/neo4j-go-driver/v5/neo4j"

	"github.com/converge-sync/converge/internal/graph"
	"github.com/converge-sync/converge/pkg/contract"
)

// sentStatements are the statements the backend sends, with their
// parameters: those of the plans of planScenarios, and those that
// Ensure (repairing a schema), Document, ScanDocuments, ScanKeys,
// WipeChunks, WipeDocuments and Wipe send,
// recorded from a backend on the model.
func sentStatements(t *testing.T) []statement {
	t.Helper()
	var out []statement
	for _, c := range planScenarios {
		for _, p := range planTransactions(t, c.docs, c.batch, c.stale...) {
			out = append(out, p.statements...)
		}
	}
	r := newFakeRunner()
	// Schemas in which Ensure sends every schema statement: a constraint
	// missing, a failed index, an index a dead creator left; then an
	// index populating.
	r.graph.indexes = map[string]modelIndex{
		"converge_chunk_id": {owner: "converge_chunk_id", state: indexFailed},
		"converge_tag_name": {state: indexPopulating, percent: 100},
	}
	b := newTestBackend(r, 2)
	if err := b.Ensure(ctx()); err != nil {
		t.Fatal(err)
	}
	r.graph.indexes["converge_document_key"] = modelIndex{owner: "converge_document_key", state: indexPopulating, percent: 50}
	r.graph.awaitOnline = true
	if err := b.Ensure(ctx()); err != nil {
		t.Fatal(err)
	}
	mustApply(t, b, doc("a", 1, 1, []string{"b"}, []string{"t"}))
	if _, _, err := b.Document(ctx(), "a"); err != nil {
		t.Fatal(err)
	}
	if err := b.ScanDocuments(ctx(), func(graph.View) error { return nil }); err != nil {
		t.Fatal(err)
	}
	if err := b.ScanKeys(ctx(), func(string, string) error { return nil }); err != nil {
		t.Fatal(err)
	}
	if _, err := b.WipeChunks(ctx(), []string{contract.ChunkID("a", 1, 0).String()}); err != nil {
		t.Fatal(err)
	}
	if _, err := b.WipeDocuments(ctx(), []string{"a", "b"}); err != nil {
		t.Fatal(err)
	}
	if _, err := b.Wipe(ctx()); err != nil {
		t.Fatal(err)
	}
	for _, a := range r.attempts {
		for _, c := range a.calls {
			out = append(out, statement{c.name, statementCypher(t, c.name), c.params})
		}
	}
	return out
}

func statementCypher(t *testing.T, name string) string {
	t.Helper()
	for _, s := range statementNames {
		if s.name == name {
			return s.cypher
		}
	}
	t.Fatalf("no statement named %q", name)
	return ""
}

// TestStatementsExplain has the test server parse and plan every
// statement the backend sends (EXPLAIN runs nothing), with the
// parameters it sends them with: a statement Neo4j cannot parse or plan,
// or a parameter of a type it rejects, fails here rather than in
// production. Every constant of the package must be among them.
func TestStatementsExplain(t *testing.T) {
	sent := sentStatements(t)
	b := newServerBackend(t, Config{})
	explained := map[string]int{}
	for _, st := range sent {
		_, err := neo4j.ExecuteQuery(ctx(), b.driver, "EXPLAIN "+st.cypher, st.params,
			neo4j.EagerResultTransformer, neo4j.ExecuteQueryWithDatabase(b.cfg.Database))
		if err != nil {
			t.Errorf("EXPLAIN %s with %v: %v", st.name, st.params, err)
		}
		explained[st.name]++
	}
	var missing []string
	for _, s := range statementNames {
		if explained[s.name] == 0 {
			missing = append(missing, s.name)
		}
	}
	if len(missing) > 0 {
		t.Errorf("statements never sent, so never explained: %s", strings.Join(missing, ", "))
	}
	t.Logf("explained %d statements: %v", len(sent), fmt.Sprint(explained))
}
