package neo4j

import (
	"fmt"
	"testing"

	"github.com/converge-sync/converge/internal/graph"
)

// BenchmarkPlanBatch measures turning one batch of 100 documents (8
// chunks, 5 links, 3 tags each) into the parameters of its statements.
func BenchmarkPlanBatch(b *testing.B) {
	docs := make([]graph.Doc, 100)
	for i := range docs {
		var links []string
		for j := range 5 {
			links = append(links, fmt.Sprintf("doc-%03d", (i*7+j)%100))
		}
		docs[i] = doc(fmt.Sprintf("doc-%03d", i), 1, 8, links, []string{"t1", "t2", fmt.Sprint("t", i%10)})
	}
	b.ReportAllocs()
	for b.Loop() {
		batches, err := planBatches(docs, 100)
		if err != nil {
			b.Fatal(err)
		}
		_ = guardStatement(batches[0])
		_ = writeStatements(batches[0])
		_ = fenceStatement(batches[0])
	}
}
