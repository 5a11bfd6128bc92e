package qdranttest_test

import (
	"context"
	"errors"
	"math"
	"slices"
	"testing"

	"github.com/qdrant/go-client/qdrant"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	"github.com/converge-sync/converge/internal/index/qdranttest"
)

func connect(t *testing.T, s *qdranttest.Server, apiKey string) *qdrant.Client {
	t.Helper()
	c, err := qdrant.NewClient(&qdrant.Config{Host: s.Host(), Port: s.Port(), APIKey: apiKey, SkipCompatibilityCheck: true, PoolSize: 1})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = c.Close() })
	return c
}

func ctx() context.Context { return context.Background() }

func wantCode(t *testing.T, err error, code codes.Code) {
	t.Helper()
	if status.Code(err) != code {
		t.Fatalf("got %v; want code %v", err, code)
	}
}

func mustOK(t *testing.T, err error) {
	t.Helper()
	if err != nil {
		t.Fatal(err)
	}
}

func create(t *testing.T, c *qdrant.Client, name string, dim uint64, d qdrant.Distance) {
	t.Helper()
	mustOK(t, c.CreateCollection(ctx(), &qdrant.CreateCollection{
		CollectionName: name,
		VectorsConfig:  qdrant.NewVectorsConfig(&qdrant.VectorParams{Size: dim, Distance: d}),
	}))
}

func upsert(t *testing.T, c *qdrant.Client, collection string, points ...*qdrant.PointStruct) {
	t.Helper()
	_, err := c.Upsert(ctx(), &qdrant.UpsertPoints{CollectionName: collection, Wait: qdrant.PtrOf(true), Points: points})
	mustOK(t, err)
}

func pt(id uint64, vec []float32, payload map[string]any) *qdrant.PointStruct {
	return &qdrant.PointStruct{Id: qdrant.NewIDNum(id), Vectors: qdrant.NewVectorsDense(vec), Payload: qdrant.NewValueMap(payload)}
}

func ids[T interface{ GetId() *qdrant.PointId }](points []T) []uint64 {
	out := make([]uint64, len(points))
	for i, p := range points {
		out[i] = p.GetId().GetNum()
	}
	return out
}

func TestHealthCheckIsOpenAndReportsVersion(t *testing.T) {
	s := qdranttest.Start(t, qdranttest.WithAPIKey("secret"))
	reply, err := connect(t, s, "").HealthCheck(ctx())
	mustOK(t, err)
	if reply.GetVersion() != qdranttest.Version {
		t.Fatalf("version %q; want %q", reply.GetVersion(), qdranttest.Version)
	}
}

func TestAPIKey(t *testing.T) {
	s := qdranttest.Start(t, qdranttest.WithAPIKey("secret"))
	_, err := connect(t, s, "").ListCollections(ctx())
	wantCode(t, err, codes.Unauthenticated)
	_, err = connect(t, s, "wrong").ListCollections(ctx())
	wantCode(t, err, codes.Unauthenticated)
	_, err = connect(t, s, "secret").ListCollections(ctx())
	mustOK(t, err)
}

func TestCollectionErrors(t *testing.T) {
	s := qdranttest.Start(t)
	c := connect(t, s, "")
	_, err := c.GetCollectionInfo(ctx(), "missing")
	wantCode(t, err, codes.NotFound)
	_, err = c.Count(ctx(), &qdrant.CountPoints{CollectionName: "missing"})
	wantCode(t, err, codes.NotFound)

	create(t, c, "docs", 3, qdrant.Distance_Cosine)
	err = c.CreateCollection(ctx(), &qdrant.CreateCollection{
		CollectionName: "docs",
		VectorsConfig:  qdrant.NewVectorsConfig(&qdrant.VectorParams{Size: 3, Distance: qdrant.Distance_Cosine}),
	})
	wantCode(t, err, codes.AlreadyExists) // Qdrant: "Wrong input: Collection `docs` already exists!"
	err = c.CreateCollection(ctx(), &qdrant.CreateCollection{
		CollectionName: "zero",
		VectorsConfig:  qdrant.NewVectorsConfig(&qdrant.VectorParams{Size: 0, Distance: qdrant.Distance_Cosine}),
	})
	wantCode(t, err, codes.InvalidArgument)

	_, err = c.Upsert(ctx(), &qdrant.UpsertPoints{CollectionName: "docs", Points: []*qdrant.PointStruct{pt(1, []float32{1, 0}, nil)}})
	wantCode(t, err, codes.InvalidArgument)
	_, err = c.Upsert(ctx(), &qdrant.UpsertPoints{CollectionName: "docs", Points: []*qdrant.PointStruct{
		{Id: qdrant.NewIDUUID("not-a-uuid"), Vectors: qdrant.NewVectorsDense([]float32{1, 0, 0})},
	}})
	wantCode(t, err, codes.InvalidArgument)
	_, err = c.Count(ctx(), &qdrant.CountPoints{CollectionName: "docs", Filter: &qdrant.Filter{
		Must: []*qdrant.Condition{qdrant.NewMatchText("text", "hello")},
	}})
	wantCode(t, err, codes.InvalidArgument)

	// As in Qdrant, a batch with a wrong-size vector is refused after
	// applying the points before it: whole chunks of 32 and the head of
	// its own chunk.
	batch := make([]*qdrant.PointStruct, 0, 40)
	for i := range uint64(40) {
		vec := []float32{1, 0, 0}
		if i == 35 {
			vec = []float32{1, 0}
		}
		batch = append(batch, pt(100+i, vec, nil))
	}
	_, err = c.Upsert(ctx(), &qdrant.UpsertPoints{CollectionName: "docs", Points: batch})
	wantCode(t, err, codes.InvalidArgument)
	n, err := c.Count(ctx(), &qdrant.CountPoints{CollectionName: "docs"})
	mustOK(t, err)
	if n != 35 {
		t.Fatalf("count after a batch refused at its 36th point = %d; want 35", n)
	}
	// A malformed id is refused before anything is written.
	_, err = c.Upsert(ctx(), &qdrant.UpsertPoints{CollectionName: "docs", Points: []*qdrant.PointStruct{
		pt(1, []float32{1, 0, 0}, nil), {Id: qdrant.NewIDUUID("bad"), Vectors: qdrant.NewVectorsDense([]float32{1, 0, 0})},
	}})
	wantCode(t, err, codes.InvalidArgument)
	if n, _ := c.Count(ctx(), &qdrant.CountPoints{CollectionName: "docs"}); n != 35 {
		t.Fatalf("count after a batch with a malformed id = %d; want 35", n)
	}
}

func TestUpdateFilter(t *testing.T) {
	s := qdranttest.Start(t)
	c := connect(t, s, "")
	create(t, c, "docs", 2, qdrant.Distance_Cosine)
	upsert(t, c, "docs", pt(1, []float32{1, 0}, map[string]any{"version": 5}), pt(2, []float32{1, 0}, map[string]any{"version": 1}))

	// Only stored points with version < 3 are updated; point 3 is new and
	// is inserted regardless of the filter.
	_, err := c.Upsert(ctx(), &qdrant.UpsertPoints{
		CollectionName: "docs",
		Wait:           qdrant.PtrOf(true),
		Points: []*qdrant.PointStruct{
			pt(1, []float32{1, 0}, map[string]any{"version": 3}),
			pt(2, []float32{1, 0}, map[string]any{"version": 3}),
			pt(3, []float32{1, 0}, map[string]any{"version": 3}),
		},
		UpdateFilter: &qdrant.Filter{Must: []*qdrant.Condition{qdrant.NewRange("version", &qdrant.Range{Lt: qdrant.PtrOf(3.0)})}},
	})
	mustOK(t, err)
	got, err := c.Get(ctx(), &qdrant.GetPoints{CollectionName: "docs", Ids: []*qdrant.PointId{qdrant.NewIDNum(1), qdrant.NewIDNum(2), qdrant.NewIDNum(3)}, WithPayload: qdrant.NewWithPayload(true)})
	mustOK(t, err)
	versions := map[uint64]int64{}
	for _, p := range got {
		versions[p.GetId().GetNum()] = p.GetPayload()["version"].GetIntegerValue()
	}
	if want := map[uint64]int64{1: 5, 2: 3, 3: 3}; !mapsEqual(versions, want) {
		t.Fatalf("versions after conditional upsert = %v; want %v", versions, want)
	}
}

func mapsEqual[K comparable, V comparable](a, b map[K]V) bool {
	if len(a) != len(b) {
		return false
	}
	for k, v := range a {
		if w, ok := b[k]; !ok || w != v {
			return false
		}
	}
	return true
}

func TestFilters(t *testing.T) {
	s := qdranttest.Start(t)
	c := connect(t, s, "")
	create(t, c, "docs", 2, qdrant.Distance_Dot)
	upsert(t, c, "docs",
		pt(1, []float32{1, 0}, map[string]any{"key": "a", "version": 1, "tags": []any{"x", "y"}}),
		pt(2, []float32{1, 0}, map[string]any{"key": "a", "version": 2}),
		pt(3, []float32{1, 0}, map[string]any{"key": "b", "version": 1, "tags": []any{}}),
		pt(4, []float32{1, 0}, map[string]any{"key": "c", "version": 7, "note": nil}),
	)
	cases := []struct {
		name   string
		filter *qdrant.Filter
		want   []uint64
	}{
		{"must", &qdrant.Filter{Must: []*qdrant.Condition{qdrant.NewMatchKeyword("key", "a"), qdrant.NewMatchInt("version", 2)}}, []uint64{2}},
		{"should", &qdrant.Filter{Should: []*qdrant.Condition{qdrant.NewMatchKeyword("key", "b"), qdrant.NewMatchInt("version", 7)}}, []uint64{3, 4}},
		{"must_not", &qdrant.Filter{MustNot: []*qdrant.Condition{qdrant.NewMatchKeyword("key", "a")}}, []uint64{3, 4}},
		{"array element", &qdrant.Filter{Must: []*qdrant.Condition{qdrant.NewMatchKeyword("tags", "y")}}, []uint64{1}},
		{"keywords", &qdrant.Filter{Must: []*qdrant.Condition{qdrant.NewMatchKeywords("key", "b", "c")}}, []uint64{3, 4}},
		{"range", &qdrant.Filter{Must: []*qdrant.Condition{qdrant.NewRange("version", &qdrant.Range{Gte: qdrant.PtrOf(2.0)})}}, []uint64{2, 4}},
		{"has_id", &qdrant.Filter{Must: []*qdrant.Condition{qdrant.NewHasID(qdrant.NewIDNum(3), qdrant.NewIDNum(9))}}, []uint64{3}},
		{"is_empty", &qdrant.Filter{Must: []*qdrant.Condition{qdrant.NewIsEmpty("tags")}}, []uint64{2, 3, 4}},
		{"is_null", &qdrant.Filter{Must: []*qdrant.Condition{qdrant.NewIsNull("note")}}, []uint64{4}},
		{"nested should of musts", &qdrant.Filter{Should: []*qdrant.Condition{
			qdrant.NewFilterAsCondition(&qdrant.Filter{Must: []*qdrant.Condition{qdrant.NewMatchKeyword("key", "a")}, MustNot: []*qdrant.Condition{qdrant.NewMatchInt("version", 1)}}),
			qdrant.NewFilterAsCondition(&qdrant.Filter{Must: []*qdrant.Condition{qdrant.NewMatchKeyword("key", "c")}}),
		}}, []uint64{2, 4}},
		{"min_should", &qdrant.Filter{MinShould: &qdrant.MinShould{MinCount: 2, Conditions: []*qdrant.Condition{
			qdrant.NewMatchKeyword("key", "a"), qdrant.NewMatchInt("version", 1), qdrant.NewMatchKeyword("tags", "x"),
		}}}, []uint64{1}},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			got, err := c.Scroll(ctx(), &qdrant.ScrollPoints{CollectionName: "docs", Filter: tc.filter, Limit: qdrant.PtrOf(uint32(100))})
			mustOK(t, err)
			if !slices.Equal(ids(got), tc.want) {
				t.Fatalf("got %v; want %v", ids(got), tc.want)
			}
			n, err := c.Count(ctx(), &qdrant.CountPoints{CollectionName: "docs", Filter: tc.filter, Exact: qdrant.PtrOf(true)})
			mustOK(t, err)
			if int(n) != len(tc.want) {
				t.Fatalf("count %d; want %d", n, len(tc.want))
			}
		})
	}
}

func TestScrollPages(t *testing.T) {
	s := qdranttest.Start(t)
	c := connect(t, s, "")
	create(t, c, "docs", 2, qdrant.Distance_Cosine)
	for i := uint64(25); i >= 1; i-- {
		upsert(t, c, "docs", pt(i, []float32{1, 1}, nil))
	}
	var all []uint64
	var offset *qdrant.PointId
	pages := 0
	for {
		page, next, err := c.ScrollAndOffset(ctx(), &qdrant.ScrollPoints{CollectionName: "docs", Offset: offset, Limit: qdrant.PtrOf(uint32(10)), WithVectors: qdrant.NewWithVectors(true)})
		mustOK(t, err)
		pages++
		all = append(all, ids(page)...)
		for _, p := range page {
			v := p.GetVectors().GetVector().GetDense().GetData()
			if math.Abs(float64(v[0])-1/math.Sqrt2) > 1e-6 {
				t.Fatalf("stored cosine vector %v is not normalised", v)
			}
		}
		if next == nil {
			break
		}
		offset = next
	}
	if pages != 3 || len(all) != 25 || !slices.IsSorted(all) {
		t.Fatalf("%d pages, ids %v; want 3 pages of ids 1..25 in order", pages, all)
	}
}

func TestQueryRanksByCosine(t *testing.T) {
	s := qdranttest.Start(t)
	c := connect(t, s, "")
	create(t, c, "docs", 2, qdrant.Distance_Cosine)
	upsert(t, c, "docs",
		pt(1, []float32{0, 1}, map[string]any{"kind": "x"}),
		pt(2, []float32{1, 0}, map[string]any{"kind": "x"}),
		pt(3, []float32{2, 0}, map[string]any{"kind": "x"}), // same direction as 2
		pt(4, []float32{1, 1}, map[string]any{"kind": "x"}),
		pt(5, []float32{1, 0}, map[string]any{"kind": "y"}),
	)
	hits, err := c.Query(ctx(), &qdrant.QueryPoints{
		CollectionName: "docs",
		Query:          qdrant.NewQueryDense([]float32{3, 0}),
		Filter:         &qdrant.Filter{Must: []*qdrant.Condition{qdrant.NewMatchKeyword("kind", "x")}},
		Limit:          qdrant.PtrOf(uint64(3)),
	})
	mustOK(t, err)
	// 2 and 3 tie at 1; ties come by descending id.
	if got := ids(hits); !slices.Equal(got, []uint64{3, 2, 4}) {
		t.Fatalf("ranking %v; want [3 2 4]", got)
	}
	if math.Abs(float64(hits[2].GetScore())-1/math.Sqrt2) > 1e-6 {
		t.Fatalf("cosine of (1,1) and (3,0) = %v; want 1/sqrt(2)", hits[2].GetScore())
	}
	hits, err = c.Query(ctx(), &qdrant.QueryPoints{
		CollectionName: "docs",
		Query:          qdrant.NewQueryDense([]float32{1, 0}),
		ScoreThreshold: qdrant.PtrOf(float32(0.5)),
	})
	mustOK(t, err)
	if got := ids(hits); !slices.Equal(got, []uint64{5, 3, 2, 4}) {
		t.Fatalf("with threshold 0.5: %v; want [5 3 2 4]", got)
	}
	_, err = c.Query(ctx(), &qdrant.QueryPoints{CollectionName: "docs", Query: qdrant.NewQueryDense([]float32{1, 0, 0})})
	wantCode(t, err, codes.InvalidArgument)
}

func TestAliases(t *testing.T) {
	s := qdranttest.Start(t)
	c := connect(t, s, "")
	create(t, c, "v1", 2, qdrant.Distance_Cosine)
	create(t, c, "v2", 2, qdrant.Distance_Cosine)
	upsert(t, c, "v1", pt(1, []float32{1, 0}, nil))
	upsert(t, c, "v2", pt(1, []float32{1, 0}, nil), pt(2, []float32{1, 0}, nil))
	count := func(name string) uint64 {
		t.Helper()
		n, err := c.Count(ctx(), &qdrant.CountPoints{CollectionName: name})
		mustOK(t, err)
		return n
	}

	mustOK(t, c.CreateAlias(ctx(), "live", "v1"))
	if n := count("live"); n != 1 {
		t.Fatalf("live -> v1 counts %d; want 1", n)
	}
	mustOK(t, c.UpdateAliases(ctx(), []*qdrant.AliasOperations{qdrant.NewAliasDelete("live"), qdrant.NewAliasCreate("live", "v2")}))
	if n := count("live"); n != 2 {
		t.Fatalf("live -> v2 counts %d; want 2", n)
	}
	// Deleting a missing alias is not an error in Qdrant.
	mustOK(t, c.DeleteAlias(ctx(), "never"))
	wantCode(t, c.CreateAlias(ctx(), "x", "missing"), codes.NotFound)
	wantCode(t, c.RenameAlias(ctx(), "missing", "y"), codes.NotFound)
	wantCode(t, c.CreateAlias(ctx(), "v1", "v2"), codes.AlreadyExists)
	err := c.CreateCollection(ctx(), &qdrant.CreateCollection{
		CollectionName: "live",
		VectorsConfig:  qdrant.NewVectorsConfig(&qdrant.VectorParams{Size: 2, Distance: qdrant.Distance_Cosine}),
	})
	wantCode(t, err, codes.InvalidArgument)

	// CollectionExists resolves aliases, as Qdrant does; listing a
	// collection's aliases does not, and needs no collection.
	for name, want := range map[string]bool{"live": true, "v1": true, "missing": false} {
		exists, err := c.CollectionExists(ctx(), name)
		mustOK(t, err)
		if exists != want {
			t.Fatalf("CollectionExists(%q) = %v; want %v", name, exists, want)
		}
	}
	for name, want := range map[string]int{"v2": 1, "live": 0, "missing": 0} {
		aliases, err := c.ListCollectionAliases(ctx(), name)
		mustOK(t, err)
		if len(aliases) != want {
			t.Fatalf("ListCollectionAliases(%q) = %v; want %d", name, aliases, want)
		}
	}

	mustOK(t, c.RenameAlias(ctx(), "live", "current"))
	aliases, err := c.ListAliases(ctx())
	mustOK(t, err)
	if len(aliases) != 1 || aliases[0].GetAliasName() != "current" || aliases[0].GetCollectionName() != "v2" {
		t.Fatalf("aliases %v; want current -> v2", aliases)
	}
	mustOK(t, c.DeleteCollection(ctx(), "v2"))
	_, err = c.Count(ctx(), &qdrant.CountPoints{CollectionName: "current"})
	wantCode(t, err, codes.NotFound)
	if aliases, _ := c.ListAliases(ctx()); len(aliases) != 0 {
		t.Fatalf("aliases of a dropped collection survive: %v", aliases)
	}
}

func TestDeleteByFilterAndIDs(t *testing.T) {
	s := qdranttest.Start(t)
	c := connect(t, s, "")
	create(t, c, "docs", 2, qdrant.Distance_Cosine)
	upsert(t, c, "docs", pt(1, []float32{1, 0}, map[string]any{"k": "a"}), pt(2, []float32{1, 0}, map[string]any{"k": "b"}), pt(3, []float32{1, 0}, map[string]any{"k": "a"}))
	_, err := c.Delete(ctx(), &qdrant.DeletePoints{CollectionName: "docs", Points: qdrant.NewPointsSelectorFilter(&qdrant.Filter{Must: []*qdrant.Condition{qdrant.NewMatchKeyword("k", "a")}})})
	mustOK(t, err)
	_, err = c.Delete(ctx(), &qdrant.DeletePoints{CollectionName: "docs", Points: qdrant.NewPointsSelector(qdrant.NewIDNum(9))})
	mustOK(t, err)
	got, err := c.Scroll(ctx(), &qdrant.ScrollPoints{CollectionName: "docs"})
	mustOK(t, err)
	if !slices.Equal(ids(got), []uint64{2}) {
		t.Fatalf("left %v; want [2]", ids(got))
	}
}

// A failing method answers Unavailable without effect and counts the
// call, until it is cleared; a method the server does not serve panics.
func TestFail(t *testing.T) {
	s := qdranttest.Start(t)
	c := connect(t, s, "")
	create(t, c, "v1", 2, qdrant.Distance_Cosine)
	const method = "Collections/UpdateAliases"
	s.Fail(method, true)
	wantCode(t, c.CreateAlias(ctx(), "live", "v1"), codes.Unavailable)
	if aliases, err := c.ListAliases(ctx()); err != nil || len(aliases) != 0 {
		t.Fatalf("aliases after a failed CreateAlias: %v %v; want none", aliases, err)
	}
	if n := s.Calls(method); n != 1 {
		t.Errorf("%d calls counted; want the failed one", n)
	}
	s.Fail(method, false)
	mustOK(t, c.CreateAlias(ctx(), "live", "v1"))

	defer func() {
		if recover() == nil {
			t.Error("Fail of a method the server does not serve did not panic")
		}
	}()
	s.Fail("Collections/UpdateAlias", true)
}

// Strict mode refuses, as InvalidArgument, exact counts when exact search
// is off, filters on unindexed keys, limits and batches over its maxima.
func TestStrictMode(t *testing.T) {
	s := qdranttest.Start(t)
	c := connect(t, s, "")
	mustOK(t, c.CreateCollection(ctx(), &qdrant.CreateCollection{
		CollectionName: "docs",
		VectorsConfig:  qdrant.NewVectorsConfig(&qdrant.VectorParams{Size: 2, Distance: qdrant.Distance_Cosine}),
		StrictModeConfig: &qdrant.StrictModeConfig{Enabled: qdrant.PtrOf(true), SearchAllowExact: qdrant.PtrOf(false),
			UnindexedFilteringRetrieve: qdrant.PtrOf(false), UnindexedFilteringUpdate: qdrant.PtrOf(false),
			MaxQueryLimit: qdrant.PtrOf(uint32(5)), UpsertMaxBatchsize: qdrant.PtrOf(uint64(2)), FilterMaxConditions: qdrant.PtrOf(uint64(2))},
	}))
	info, err := c.GetCollectionInfo(ctx(), "docs")
	mustOK(t, err)
	if !info.GetConfig().GetStrictModeConfig().GetEnabled() {
		t.Fatalf("strict mode not reported: %v", info.GetConfig())
	}
	byKey := &qdrant.Filter{Must: []*qdrant.Condition{qdrant.NewMatchKeyword("k", "a")}}
	// A count without the exact flag is exact, as in Qdrant.
	for _, exact := range []*bool{qdrant.PtrOf(true), nil} {
		_, err = c.Count(ctx(), &qdrant.CountPoints{CollectionName: "docs", Exact: exact})
		wantCode(t, err, codes.InvalidArgument)
	}
	inexact := qdrant.PtrOf(false)
	_, err = c.Count(ctx(), &qdrant.CountPoints{CollectionName: "docs", Exact: inexact})
	mustOK(t, err)
	_, err = c.Count(ctx(), &qdrant.CountPoints{CollectionName: "docs", Filter: byKey, Exact: inexact})
	wantCode(t, err, codes.InvalidArgument)
	_, err = c.Delete(ctx(), &qdrant.DeletePoints{CollectionName: "docs", Points: qdrant.NewPointsSelectorFilter(byKey)})
	wantCode(t, err, codes.InvalidArgument)
	_, err = c.Scroll(ctx(), &qdrant.ScrollPoints{CollectionName: "docs", Limit: qdrant.PtrOf(uint32(6))})
	wantCode(t, err, codes.InvalidArgument)
	_, err = c.Upsert(ctx(), &qdrant.UpsertPoints{CollectionName: "docs", Points: []*qdrant.PointStruct{
		pt(1, []float32{1, 0}, nil), pt(2, []float32{1, 0}, nil), pt(3, []float32{1, 0}, nil)}})
	wantCode(t, err, codes.InvalidArgument)

	_, err = c.CreateFieldIndex(ctx(), &qdrant.CreateFieldIndexCollection{CollectionName: "docs", FieldName: "k", FieldType: qdrant.PtrOf(qdrant.FieldType_FieldTypeKeyword)})
	mustOK(t, err)
	_, err = c.Count(ctx(), &qdrant.CountPoints{CollectionName: "docs", Filter: byKey, Exact: inexact})
	mustOK(t, err)
	three := &qdrant.Filter{Must: []*qdrant.Condition{qdrant.NewMatchKeyword("k", "a"), qdrant.NewMatchKeyword("k", "b"), qdrant.NewMatchKeyword("k", "c")}}
	_, err = c.Count(ctx(), &qdrant.CountPoints{CollectionName: "docs", Filter: three, Exact: inexact})
	wantCode(t, err, codes.InvalidArgument)
	_, err = c.Scroll(ctx(), &qdrant.ScrollPoints{CollectionName: "docs", Limit: qdrant.PtrOf(uint32(5))})
	mustOK(t, err)
}

// max_points_count refuses every upsert once the collection holds that
// many points (the batch that reaches it is written whole), replacing
// ones too, and lets deletes through, after which upserts go again.
func TestStrictModeMaxPointsCount(t *testing.T) {
	s := qdranttest.Start(t)
	c := connect(t, s, "")
	mustOK(t, c.CreateCollection(ctx(), &qdrant.CreateCollection{
		CollectionName:   "docs",
		VectorsConfig:    qdrant.NewVectorsConfig(&qdrant.VectorParams{Size: 2, Distance: qdrant.Distance_Cosine}),
		StrictModeConfig: &qdrant.StrictModeConfig{Enabled: qdrant.PtrOf(true), MaxPointsCount: qdrant.PtrOf(uint64(2))},
	}))
	upsert(t, c, "docs", pt(1, []float32{1, 0}, nil), pt(2, []float32{1, 0}, nil), pt(3, []float32{1, 0}, nil))
	for _, id := range []uint64{4, 1} {
		_, err := c.Upsert(ctx(), &qdrant.UpsertPoints{CollectionName: "docs", Points: []*qdrant.PointStruct{pt(id, []float32{0, 1}, nil)}})
		wantCode(t, err, codes.InvalidArgument)
		var st interface{ GRPCStatus() *status.Status }
		if !errors.As(err, &st) || st.GRPCStatus().Message() != "Bad request: Max points count limit of 2 reached!" {
			t.Errorf("upsert of %d into a full collection: %v; want Qdrant's message", id, err)
		}
	}
	_, err := c.Delete(ctx(), &qdrant.DeletePoints{CollectionName: "docs", Wait: qdrant.PtrOf(true),
		Points: qdrant.NewPointsSelector(qdrant.NewIDNum(1), qdrant.NewIDNum(2))})
	mustOK(t, err)
	upsert(t, c, "docs", pt(4, []float32{0, 1}, nil))
	if n, err := c.Count(ctx(), &qdrant.CountPoints{CollectionName: "docs"}); err != nil || n != 2 {
		t.Fatalf("count: %d %v; want 2", n, err)
	}
}

// The read-only key reads everything and writes nothing: each write is
// PermissionDenied with Qdrant's message and leaves the collection, its
// points, indexes and aliases as they were. Point writes and payload index
// creation look the collection up first, as in Qdrant, so on a missing
// collection they are NotFound; collection, alias and index deletions are
// refused whether or not the collection exists. The read-write key still
// writes, and any other key is Unauthenticated.
func TestReadOnlyAPIKey(t *testing.T) {
	s := qdranttest.Start(t, qdranttest.WithAPIKey("rw"), qdranttest.WithReadOnlyAPIKey("ro"))
	rw, ro := connect(t, s, "rw"), connect(t, s, "ro")
	create(t, rw, "docs", 2, qdrant.Distance_Cosine)
	upsert(t, rw, "docs", pt(1, []float32{1, 0}, map[string]any{"k": "a"}))
	mustOK(t, rw.CreateAlias(ctx(), "live", "docs"))

	_, err := ro.GetCollectionInfo(ctx(), "live")
	mustOK(t, err)
	_, err = ro.ListCollections(ctx())
	mustOK(t, err)
	_, err = ro.CollectionExists(ctx(), "docs")
	mustOK(t, err)
	_, err = ro.ListAliases(ctx())
	mustOK(t, err)
	_, err = ro.Count(ctx(), &qdrant.CountPoints{CollectionName: "docs"})
	mustOK(t, err)
	_, err = ro.Scroll(ctx(), &qdrant.ScrollPoints{CollectionName: "docs"})
	mustOK(t, err)
	_, err = ro.Get(ctx(), &qdrant.GetPoints{CollectionName: "docs", Ids: []*qdrant.PointId{qdrant.NewIDNum(1)}})
	mustOK(t, err)
	_, err = ro.Query(ctx(), &qdrant.QueryPoints{CollectionName: "docs", Query: qdrant.NewQuery(1, 0)})
	mustOK(t, err)

	vectors := qdrant.NewVectorsConfig(&qdrant.VectorParams{Size: 2, Distance: qdrant.Distance_Cosine})
	byID := qdrant.NewPointsSelector(qdrant.NewIDNum(1))
	writes := map[string]func(collection string) error{
		"Upsert": func(c string) error {
			_, err := ro.Upsert(ctx(), &qdrant.UpsertPoints{CollectionName: c, Wait: qdrant.PtrOf(true),
				Points: []*qdrant.PointStruct{pt(2, []float32{0, 1}, nil)}})
			return err
		},
		"Delete by id": func(c string) error {
			_, err := ro.Delete(ctx(), &qdrant.DeletePoints{CollectionName: c, Wait: qdrant.PtrOf(true), Points: byID})
			return err
		},
		"Delete by filter": func(c string) error {
			_, err := ro.Delete(ctx(), &qdrant.DeletePoints{CollectionName: c, Wait: qdrant.PtrOf(true),
				Points: qdrant.NewPointsSelectorFilter(&qdrant.Filter{})})
			return err
		},
		"SetPayload": func(c string) error {
			_, err := ro.SetPayload(ctx(), &qdrant.SetPayloadPoints{CollectionName: c, Wait: qdrant.PtrOf(true),
				Payload: qdrant.NewValueMap(map[string]any{"k": "b"}), PointsSelector: byID})
			return err
		},
		"CreateFieldIndex": func(c string) error {
			_, err := ro.CreateFieldIndex(ctx(), &qdrant.CreateFieldIndexCollection{CollectionName: c, Wait: qdrant.PtrOf(true),
				FieldName: "k", FieldType: qdrant.PtrOf(qdrant.FieldType_FieldTypeKeyword)})
			return err
		},
		"DeleteFieldIndex": func(c string) error {
			_, err := ro.DeleteFieldIndex(ctx(), &qdrant.DeleteFieldIndexCollection{CollectionName: c, Wait: qdrant.PtrOf(true), FieldName: "k"})
			return err
		},
		"CreateCollection": func(c string) error {
			return ro.CreateCollection(ctx(), &qdrant.CreateCollection{CollectionName: c + "_new", VectorsConfig: vectors})
		},
		"DeleteCollection": func(c string) error { return ro.DeleteCollection(ctx(), c) },
		"CreateAlias":      func(c string) error { return ro.CreateAlias(ctx(), "other", c) },
		"DeleteAlias":      func(string) error { return ro.DeleteAlias(ctx(), "live") },
	}
	resolvedFirst := map[string]bool{"Upsert": true, "Delete by id": true, "Delete by filter": true, "SetPayload": true, "CreateFieldIndex": true}
	for name, write := range writes {
		for _, collection := range []string{"docs", "live", "missing"} {
			err := write(collection)
			if collection == "missing" && resolvedFirst[name] {
				var st interface{ GRPCStatus() *status.Status }
				if !errors.As(err, &st) || st.GRPCStatus().Code() != codes.NotFound ||
					st.GRPCStatus().Message() != "Not found: Collection `missing` doesn't exist!" {
					t.Errorf("%s on %s with the read-only key: %v; want NotFound, Collection `missing` doesn't exist!", name, collection, err)
				}
				continue
			}
			var st interface{ GRPCStatus() *status.Status }
			if !errors.As(err, &st) || st.GRPCStatus().Code() != codes.PermissionDenied ||
				st.GRPCStatus().Message() != "Forbidden: Global manage access is required" {
				t.Errorf("%s on %s with the read-only key: %v; want PermissionDenied, Forbidden: Global manage access is required", name, collection, err)
			}
		}
	}

	info, err := rw.GetCollectionInfo(ctx(), "docs")
	mustOK(t, err)
	if n, err := rw.Count(ctx(), &qdrant.CountPoints{CollectionName: "docs"}); err != nil || n != 1 {
		t.Errorf("count after the refused writes: %d %v; want 1", n, err)
	}
	got, err := rw.Get(ctx(), &qdrant.GetPoints{CollectionName: "docs", Ids: []*qdrant.PointId{qdrant.NewIDNum(1)}, WithPayload: qdrant.NewWithPayload(true)})
	mustOK(t, err)
	if len(got) != 1 || got[0].GetPayload()["k"].GetStringValue() != "a" {
		t.Errorf("point 1 after the refused writes: %v; want payload k=a", got)
	}
	if len(info.GetPayloadSchema()) != 0 {
		t.Errorf("payload indexes after the refused writes: %v; want none", info.GetPayloadSchema())
	}
	names, err := rw.ListCollections(ctx())
	mustOK(t, err)
	aliases, err := rw.ListAliases(ctx())
	mustOK(t, err)
	if !slices.Equal(names, []string{"docs"}) || len(aliases) != 1 || aliases[0].GetAliasName() != "live" {
		t.Errorf("collections %v and aliases %v after the refused writes; want [docs] and live", names, aliases)
	}

	upsert(t, rw, "docs", pt(2, []float32{0, 1}, nil))
	_, err = connect(t, s, "wrong").Count(ctx(), &qdrant.CountPoints{CollectionName: "docs"})
	wantCode(t, err, codes.Unauthenticated)
}

// Keys changed under a running client take effect on its next call: a
// read-write key made read-only may no longer write, and may again once
// restored.
func TestSetAPIKeys(t *testing.T) {
	s := qdranttest.Start(t, qdranttest.WithAPIKey("key"))
	c := connect(t, s, "key")
	create(t, c, "docs", 2, qdrant.Distance_Cosine)
	s.SetAPIKeys("other", "key")
	_, err := c.Upsert(ctx(), &qdrant.UpsertPoints{CollectionName: "docs", Points: []*qdrant.PointStruct{pt(1, []float32{1, 0}, nil)}})
	wantCode(t, err, codes.PermissionDenied)
	if n, err := c.Count(ctx(), &qdrant.CountPoints{CollectionName: "docs"}); err != nil || n != 0 {
		t.Fatalf("count after a refused upsert: %d %v; want 0", n, err)
	}
	s.SetAPIKeys("key", "")
	upsert(t, c, "docs", pt(1, []float32{1, 0}, nil))
	s.SetAPIKeys("", "")
	_, err = connect(t, s, "").Count(ctx(), &qdrant.CountPoints{CollectionName: "docs"})
	mustOK(t, err)
}
