package qdrant_test

import (
	"fmt"
	"slices"
	"sync"
	"testing"

	qd "github.com/qdrant/go-client/qdrant"

	"github.com/converge-sync/converge/internal/embed"
	"github.com/converge-sync/converge/internal/index"
	"github.com/converge-sync/converge/internal/index/qdrant"
)

// ensureSteps are the payload indexes Ensure makes after the collection,
// in its order.
var ensureSteps = []struct {
	field string
	kind  qd.FieldType
}{
	{"key", qd.FieldType_FieldTypeKeyword},
	{"version", qd.FieldType_FieldTypeInteger},
	{"type", qd.FieldType_FieldTypeKeyword},
	{"version_high", qd.FieldType_FieldTypeInteger},
	{"version_low", qd.FieldType_FieldTypeInteger},
}

// payloadSchema is the collection's payload indexes: "field:type", sorted.
func payloadSchema(t *testing.T, c *qd.Client, collection string) []string {
	t.Helper()
	info, err := c.GetCollectionInfo(ctx(), collection)
	must(t, err)
	var out []string
	for field, s := range info.GetPayloadSchema() {
		out = append(out, fmt.Sprintf("%s:%v", field, s.GetDataType()))
	}
	slices.Sort(out)
	return out
}

// Each Qdrant request of Ensure is applied whole or not at all, so a
// process killed while it ensured leaves the collection with the first
// of its payload indexes, or none, and no embedder recorded (or no
// collection, which is a fresh start). From each such state, the next
// start (index.New: Ensure, then the embedder recorded) makes what is
// missing, and nothing twice, and the index takes writes, under strict
// mode too (Qdrant Cloud's default for new collections, which refuses
// filters on fields without an index).
func TestEnsureFinishesWhatAKilledStartLeft(t *testing.T) {
	e, err := embed.NewHash(dim)
	must(t, err)
	for _, strict := range []bool{false, true} {
		for made := range len(ensureSteps) + 1 {
			t.Run(fmt.Sprintf("strict=%v/indexes=%d", strict, made), func(t *testing.T) {
				onBoth(t, func(t *testing.T, s server) {
					c := s.client(t)
					req := &qd.CreateCollection{}
					if strict {
						req.StrictModeConfig = &qd.StrictModeConfig{Enabled: qd.PtrOf(true),
							UnindexedFilteringRetrieve: qd.PtrOf(false), UnindexedFilteringUpdate: qd.PtrOf(false)}
					}
					s.createWith(t, req)
					for _, step := range ensureSteps[:made] {
						_, err := c.CreateFieldIndex(ctx(), &qd.CreateFieldIndexCollection{CollectionName: s.collection(),
							Wait: qd.PtrOf(true), FieldName: step.field, FieldType: qd.PtrOf(step.kind)})
						must(t, err)
					}

					b := s.open(t, nil)
					x, err := index.New(ctx(), b, e, index.Options{})
					must(t, err)
					if got, want := fmt.Sprint(payloadSchema(t, c, s.collection())), "[key:Keyword type:Keyword version:Integer version_high:Integer version_low:Integer]"; got != want {
						t.Fatalf("payload indexes %s; want %s", got, want)
					}
					if s.model != nil {
						if n := s.model.Calls("Points/CreateFieldIndex"); n != len(ensureSteps) {
							t.Fatalf("%d payload indexes created in all; want each of the %d once", n, len(ensureSteps))
						}
						if n := s.model.Calls("Collections/Create"); n != 1 {
							t.Fatalf("the collection created %d times; want once", n)
						}
					}
					if stored, _, refusing := x.Embedder(); refusing != nil || stored != embed.IdentityOf(e) {
						t.Fatalf("embedder %v (refusing: %v); want %v recorded", stored, refusing, embed.IdentityOf(e))
					}
					if stored, ok, err := b.Embedder(ctx()); err != nil || !ok || stored != embed.IdentityOf(e) {
						t.Fatalf("embedder point %v, %v, %v; want %v", stored, ok, err, embed.IdentityOf(e))
					}
					must(t, b.Upsert(ctx(), []index.Point{chunk("a", 1, 0, axis(0))}))
					must(t, b.SetMarkers(ctx(), []index.Marker{{Key: "a", Version: 1}}))
					if m, err := b.Markers(ctx(), []string{"a"}); err != nil || m["a"].Version != 1 {
						t.Fatalf("markers %v, %v", m, err)
					}
				})
			})
		}
	}
}

// Instances starting at once all ensure the same collection: those whose
// create loses the race take the winner's collection. (Ten times over:
// the race is lost only now and then.)
func TestEnsureConcurrently(t *testing.T) {
	onBoth(t, func(t *testing.T, s server) {
		c := s.client(t)
		for round := range 10 {
			collection := s.name(fmt.Sprintf("round_%d", round))
			var wg sync.WaitGroup
			start := make(chan struct{})
			errs := make([]error, 4)
			for i := range errs {
				b := s.open(t, func(c *qdrant.Config) { c.Collection = collection })
				wg.Add(1)
				go func() {
					defer wg.Done()
					<-start
					errs[i] = b.Ensure(ctx(), dim)
				}()
			}
			close(start)
			wg.Wait()
			for i, err := range errs {
				if err != nil {
					t.Fatalf("round %d, instance %d: %v", round, i, err)
				}
			}
			if got := len(payloadSchema(t, c, collection)); got != len(ensureSteps) {
				t.Fatalf("round %d: %d payload indexes; want %d", round, got, len(ensureSteps))
			}
		}
	})
}
