package qdranttest_test

import (
	"context"
	"errors"
	"fmt"
	"math"
	"net"
	"slices"
	"strconv"
	"strings"
	"testing"

	"github.com/qdrant/go-client/qdrant"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	"github.com/converge-sync/converge/internal/index/qdranttest"
	"github.com/converge-sync/converge/internal/testenv"
)

// server is a Qdrant that a test runs against: the model (qdranttest) or
// a real Qdrant leased from testenv. The tests of what Qdrant itself
// defines run against both, so that the model is held to the real server
// it claims to follow ([qdranttest.Version]); the tests of what only the
// model has (Fail, SetAPIKeys, WithVersion) run on the model alone.
type server struct {
	model       *qdranttest.Server // nil for a real Qdrant
	addr        string             // gRPC host:port
	apiKey      string             // may write ("" on an open server)
	readOnlyKey string
	prefix      string // of every collection and alias name a test makes
}

// name is the collection or alias called n on s: on a real server, which
// other tests share, under the test's own prefix.
func (s server) name(n string) string { return s.prefix + n }

func (s server) connect(t *testing.T, apiKey string) *qdrant.Client {
	t.Helper()
	host, portText, err := net.SplitHostPort(s.addr)
	if err != nil {
		t.Fatal(err)
	}
	port, err := strconv.Atoi(portText)
	if err != nil {
		t.Fatal(err)
	}
	c, err := qdrant.NewClient(&qdrant.Config{Host: host, Port: port, APIKey: apiKey, SkipCompatibilityCheck: true, PoolSize: 1})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = c.Close() })
	return c
}

// onBoth runs fn against the model and against a real Qdrant.
func onBoth(t *testing.T, fn func(t *testing.T, s server)) {
	t.Helper()
	t.Run("qdranttest", func(t *testing.T) {
		m := qdranttest.Start(t)
		fn(t, server{model: m, addr: m.Addr()})
	})
	t.Run("qdrant", func(t *testing.T) {
		q := testenv.LeaseQdrant(t)
		fn(t, server{addr: q.URL, prefix: q.Collection + "_"})
	})
}

// onBothKeyed runs fn against servers that require an API key and have a
// read-only one.
func onBothKeyed(t *testing.T, fn func(t *testing.T, s server)) {
	t.Helper()
	t.Run("qdranttest", func(t *testing.T) {
		m := qdranttest.Start(t, qdranttest.WithAPIKey("rw"), qdranttest.WithReadOnlyAPIKey("ro"))
		fn(t, server{model: m, addr: m.Addr(), apiKey: "rw", readOnlyKey: "ro"})
	})
	t.Run("qdrant", func(t *testing.T) {
		q := testenv.LeaseQdrantKeyed(t)
		fn(t, server{addr: q.URL, apiKey: q.APIKey, readOnlyKey: q.ReadOnlyKey, prefix: q.Collection + "_"})
	})
}

func connect(t *testing.T, s *qdranttest.Server, apiKey string) *qdrant.Client {
	t.Helper()
	return server{addr: s.Addr()}.connect(t, apiKey)
}

func ctx() context.Context { return context.Background() }

func wantCode(t *testing.T, err error, code codes.Code) {
	t.Helper()
	if status.Code(err) != code {
		t.Fatalf("got %v; want code %v", err, code)
	}
}

// wantStatus checks the code and the message, as Qdrant words it.
func wantStatus(t *testing.T, err error, code codes.Code, message string) {
	t.Helper()
	if status.Code(err) != code || statusMessage(err) != message {
		t.Fatalf("got %v; want %v %q", err, code, message)
	}
}

// statusMessage is the message of the status err carries, without the
// client's wrapping.
func statusMessage(err error) string {
	var st interface{ GRPCStatus() *status.Status }
	if !errors.As(err, &st) {
		return fmt.Sprint(err)
	}
	return st.GRPCStatus().Message()
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

func index(t *testing.T, c *qdrant.Client, collection, field string, typ qdrant.FieldType) {
	t.Helper()
	_, err := c.CreateFieldIndex(ctx(), &qdrant.CreateFieldIndexCollection{CollectionName: collection, Wait: qdrant.PtrOf(true),
		FieldName: field, FieldType: qdrant.PtrOf(typ)})
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

func count(t *testing.T, c *qdrant.Client, collection string, filter *qdrant.Filter) uint64 {
	t.Helper()
	n, err := c.Count(ctx(), &qdrant.CountPoints{CollectionName: collection, Filter: filter, Exact: qdrant.PtrOf(true)})
	mustOK(t, err)
	return n
}

// The model follows the version of the real test server: a test server of
// another version fails here until the model has been compared with it.
func TestHealthCheckIsOpenAndReportsVersion(t *testing.T) {
	onBothKeyed(t, func(t *testing.T, s server) {
		reply, err := s.connect(t, "").HealthCheck(ctx())
		mustOK(t, err)
		if reply.GetVersion() != qdranttest.Version {
			t.Fatalf("version %q; want %q", reply.GetVersion(), qdranttest.Version)
		}
	})
	reply, err := connect(t, qdranttest.Start(t, qdranttest.WithVersion("1.17.1")), "").HealthCheck(ctx())
	mustOK(t, err)
	if reply.GetVersion() != "1.17.1" {
		t.Fatalf("WithVersion(1.17.1): version %q", reply.GetVersion())
	}
}

func TestAPIKey(t *testing.T) {
	onBothKeyed(t, func(t *testing.T, s server) {
		_, err := s.connect(t, "").ListCollections(ctx())
		wantStatus(t, err, codes.Unauthenticated, "Must provide an API key or an Authorization bearer token")
		_, err = s.connect(t, "wrong").ListCollections(ctx())
		wantStatus(t, err, codes.Unauthenticated, "Invalid API key or JWT")
		_, err = s.connect(t, s.apiKey).ListCollections(ctx())
		mustOK(t, err)
	})
}

func TestCollectionErrors(t *testing.T) {
	onBoth(t, func(t *testing.T, s server) {
		c := s.connect(t, "")
		missing, docs := s.name("missing"), s.name("docs")
		_, err := c.GetCollectionInfo(ctx(), missing)
		wantStatus(t, err, codes.NotFound, "Not found: Collection `"+missing+"` doesn't exist!")
		_, err = c.Count(ctx(), &qdrant.CountPoints{CollectionName: missing})
		wantCode(t, err, codes.NotFound)

		create(t, c, docs, 3, qdrant.Distance_Cosine)
		err = c.CreateCollection(ctx(), &qdrant.CreateCollection{
			CollectionName: docs,
			VectorsConfig:  qdrant.NewVectorsConfig(&qdrant.VectorParams{Size: 3, Distance: qdrant.Distance_Cosine}),
		})
		wantStatus(t, err, codes.AlreadyExists, "Wrong input: Collection `"+docs+"` already exists!")
		err = c.CreateCollection(ctx(), &qdrant.CreateCollection{
			CollectionName: s.name("zero"),
			VectorsConfig:  qdrant.NewVectorsConfig(&qdrant.VectorParams{Size: 0, Distance: qdrant.Distance_Cosine}),
		})
		wantStatus(t, err, codes.InvalidArgument, "Validation error in body: [vectors_config.config.size: value 0 invalid, must be from 1 to 65536]")
		for name, message := range map[string]string{
			s.name("a/b"): `Validation error in body: [collection_name: collection name cannot contain "/" char]`,
			"":            `Validation error in body: [collection_name: value "" invalid, must be from 1 to 255 characters]`,
		} {
			err = c.CreateCollection(ctx(), &qdrant.CreateCollection{
				CollectionName: name,
				VectorsConfig:  qdrant.NewVectorsConfig(&qdrant.VectorParams{Size: 3, Distance: qdrant.Distance_Cosine}),
			})
			wantStatus(t, err, codes.InvalidArgument, message)
		}

		_, err = c.Upsert(ctx(), &qdrant.UpsertPoints{CollectionName: docs, Wait: qdrant.PtrOf(true), Points: []*qdrant.PointStruct{pt(1, []float32{1, 0}, nil)}})
		wantStatus(t, err, codes.InvalidArgument, "Wrong input: Vector dimension error: expected dim: 3, got 2")
		_, err = c.Upsert(ctx(), &qdrant.UpsertPoints{CollectionName: docs, Points: []*qdrant.PointStruct{
			{Id: qdrant.NewIDUUID("not-a-uuid"), Vectors: qdrant.NewVectorsDense([]float32{1, 0, 0})},
		}})
		wantStatus(t, err, codes.InvalidArgument, "Unable to parse UUID: not-a-uuid")
		_, err = c.Upsert(ctx(), &qdrant.UpsertPoints{CollectionName: docs, Points: []*qdrant.PointStruct{{Id: qdrant.NewIDNum(1)}}})
		wantStatus(t, err, codes.InvalidArgument, "Expected some vectors")
		_, err = c.Upsert(ctx(), &qdrant.UpsertPoints{CollectionName: docs, Points: []*qdrant.PointStruct{{Vectors: qdrant.NewVectorsDense([]float32{1, 0, 0})}}})
		wantStatus(t, err, codes.InvalidArgument, "Empty ID is not allowed")
		_, err = c.Delete(ctx(), &qdrant.DeletePoints{CollectionName: docs})
		wantStatus(t, err, codes.InvalidArgument, "PointSelector is missing")
		_, err = c.Count(ctx(), &qdrant.CountPoints{CollectionName: docs, Filter: &qdrant.Filter{Must: []*qdrant.Condition{qdrant.NewMatchKeyword("", "a")}}})
		wantStatus(t, err, codes.InvalidArgument, "Invalid json path: ''")
		// A malformed id is refused before anything is written.
		_, err = c.Upsert(ctx(), &qdrant.UpsertPoints{CollectionName: docs, Wait: qdrant.PtrOf(true), Points: []*qdrant.PointStruct{
			pt(1, []float32{1, 0, 0}, nil), {Id: qdrant.NewIDUUID("bad"), Vectors: qdrant.NewVectorsDense([]float32{1, 0, 0})},
		}})
		wantCode(t, err, codes.InvalidArgument)
		if n := count(t, c, docs, nil); n != 0 {
			t.Fatalf("count after a batch with a malformed id = %d; want 0", n)
		}

		// Not modelled: the model refuses a text match, which Qdrant
		// answers without a full-text index.
		_, err = c.Count(ctx(), &qdrant.CountPoints{CollectionName: docs, Filter: &qdrant.Filter{
			Must: []*qdrant.Condition{qdrant.NewMatchText("text", "hello")},
		}})
		if s.model != nil {
			wantCode(t, err, codes.InvalidArgument)
		} else {
			mustOK(t, err)
		}
	})
}

// Qdrant 1.16.3 applies an upsert in chunks of 32 points taken in an
// order of its own (a hash map's, seeded for each request), in each chunk
// the points that exist before the new ones, and fails the request at a
// wrong-size vector, leaving applied what came before it. Which points
// those are changes from one request to the next; but with 39 points that
// exist and a new one of the wrong size, all the existing points of the
// wrong one's chunk are applied: 31 when it falls in the first chunk (of
// 32), all 39 when in the second (of 8). With the wrong one existing and
// the 39 others new, it is applied first in its chunk: none, or the 32 of
// the first chunk.
func TestUpsertAppliesChunksUntilAWrongSizeVector(t *testing.T) {
	onBoth(t, func(t *testing.T, s server) {
		c := s.connect(t, "")
		const bad, tries = 17, 8
		for _, tc := range []struct {
			name      string
			badExists bool
			want      []int
		}{
			{"others exist", false, []int{31, 39}},
			{"the wrong one exists", true, []int{0, 32}},
		} {
			seen := make(map[int]int)
			for try := range tries {
				collection := s.name(fmt.Sprintf("chunks_%v_%d", tc.badExists, try))
				create(t, c, collection, 2, qdrant.Distance_Cosine)
				var before, batch []*qdrant.PointStruct
				for i := range uint64(40) {
					if (i == bad) == tc.badExists {
						before = append(before, pt(i, []float32{1, 0}, map[string]any{"v": 1}))
					}
					vec := []float32{0, 1}
					if i == bad {
						vec = []float32{0, 1, 0}
					}
					batch = append(batch, pt(i, vec, map[string]any{"v": 2}))
				}
				upsert(t, c, collection, before...)
				_, err := c.Upsert(ctx(), &qdrant.UpsertPoints{CollectionName: collection, Wait: qdrant.PtrOf(true), Points: batch})
				wantStatus(t, err, codes.InvalidArgument, "Wrong input: Vector dimension error: expected dim: 2, got 3")
				written := int(count(t, c, collection, &qdrant.Filter{Must: []*qdrant.Condition{qdrant.NewMatchInt("v", 2)}}))
				if !slices.Contains(tc.want, written) {
					t.Fatalf("%s: %d points written before the refusal; want one of %v", tc.name, written, tc.want)
				}
				seen[written]++
				mustOK(t, c.DeleteCollection(ctx(), collection))
			}
			t.Logf("%s: points written before the refusal, over %d requests: %v", tc.name, tries, seen)
		}
	})
}

// Without wait, Qdrant answers once it has accepted an upsert, and a
// vector of the wrong size, refused only as the point is applied, is
// reported to no one.
func TestUpsertWithoutWait(t *testing.T) {
	onBoth(t, func(t *testing.T, s server) {
		c := s.connect(t, "")
		docs := s.name("docs")
		create(t, c, docs, 2, qdrant.Distance_Cosine)
		resp, err := c.GetPointsClient().Upsert(ctx(), &qdrant.UpsertPoints{CollectionName: docs, Points: []*qdrant.PointStruct{pt(1, []float32{1, 0, 0}, nil)}})
		mustOK(t, err)
		if st := resp.GetResult().GetStatus(); st != qdrant.UpdateStatus_Acknowledged {
			t.Fatalf("status %v; want Acknowledged", st)
		}
		resp, err = c.GetPointsClient().Upsert(ctx(), &qdrant.UpsertPoints{CollectionName: docs, Wait: qdrant.PtrOf(true), Points: []*qdrant.PointStruct{pt(2, []float32{1, 0}, nil)}})
		mustOK(t, err)
		if st := resp.GetResult().GetStatus(); st != qdrant.UpdateStatus_Completed {
			t.Fatalf("status %v; want Completed", st)
		}
		got, err := c.Scroll(ctx(), &qdrant.ScrollPoints{CollectionName: docs})
		mustOK(t, err)
		if !slices.Equal(ids(got), []uint64{2}) {
			t.Fatalf("points %v; want [2]", ids(got))
		}
	})
}

func TestUpdateFilter(t *testing.T) {
	// Only stored points with version < 3 are updated; point 3 is new and
	// is inserted regardless of the filter; point 4 exists without a
	// version and is kept.
	check := func(t *testing.T, c *qdrant.Client, docs string, mode *qdrant.UpdateMode, want map[uint64]int64) {
		t.Helper()
		upsert(t, c, docs, pt(1, []float32{1, 0}, map[string]any{"version": 5}), pt(2, []float32{1, 0}, map[string]any{"version": 1}),
			pt(4, []float32{1, 0}, map[string]any{"other": 1}))
		_, err := c.Upsert(ctx(), &qdrant.UpsertPoints{
			CollectionName: docs,
			Wait:           qdrant.PtrOf(true),
			Points: []*qdrant.PointStruct{
				pt(1, []float32{1, 0}, map[string]any{"version": 3}),
				pt(2, []float32{1, 0}, map[string]any{"version": 3}),
				pt(3, []float32{1, 0}, map[string]any{"version": 3}),
				pt(4, []float32{1, 0}, map[string]any{"version": 3}),
			},
			UpdateFilter: &qdrant.Filter{Must: []*qdrant.Condition{qdrant.NewRange("version", &qdrant.Range{Lt: qdrant.PtrOf(3.0)})}},
			UpdateMode:   mode,
		})
		mustOK(t, err)
		got, err := c.Get(ctx(), &qdrant.GetPoints{CollectionName: docs, Ids: []*qdrant.PointId{qdrant.NewIDNum(1), qdrant.NewIDNum(2), qdrant.NewIDNum(3), qdrant.NewIDNum(4)},
			WithPayload: qdrant.NewWithPayload(true)})
		mustOK(t, err)
		versions := map[uint64]int64{}
		for _, p := range got {
			versions[p.GetId().GetNum()] = p.GetPayload()["version"].GetIntegerValue()
		}
		if !mapsEqual(versions, want) {
			t.Fatalf("versions after conditional upsert (update_mode %v) = %v; want %v", mode, versions, want)
		}
	}
	onBoth(t, func(t *testing.T, s server) {
		c := s.connect(t, "")
		docs := s.name("docs")
		create(t, c, docs, 2, qdrant.Distance_Cosine)
		check(t, c, docs, nil, map[uint64]int64{1: 5, 2: 3, 3: 3, 4: 0})
		// Qdrant 1.16.3 does not know update_mode and ignores it.
		mustOK(t, c.DeleteCollection(ctx(), docs))
		create(t, c, docs, 2, qdrant.Distance_Cosine)
		check(t, c, docs, qdrant.UpdateMode_UpdateOnly.Enum(), map[uint64]int64{1: 5, 2: 3, 3: 3, 4: 0})
	})
	// From 1.17 it is honoured: update only inserts nothing.
	c := connect(t, qdranttest.Start(t, qdranttest.WithVersion("1.17.1")), "")
	create(t, c, "docs", 2, qdrant.Distance_Cosine)
	check(t, c, "docs", qdrant.UpdateMode_UpdateOnly.Enum(), map[uint64]int64{1: 5, 2: 3, 4: 0})
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
	onBoth(t, func(t *testing.T, s server) {
		c := s.connect(t, "")
		docs := s.name("docs")
		create(t, c, docs, 2, qdrant.Distance_Dot)
		upsert(t, c, docs,
			pt(1, []float32{1, 0}, map[string]any{"key": "a", "version": 1, "tags": []any{"x", "y"}}),
			pt(2, []float32{1, 0}, map[string]any{"key": "a", "version": 2}),
			pt(3, []float32{1, 0}, map[string]any{"key": "b", "version": 1, "tags": []any{}}),
			pt(4, []float32{1, 0}, map[string]any{"key": "c", "version": 7, "note": nil}),
			pt(5, []float32{1, 0}, map[string]any{"key": "d", "version": "7", "score": 2.5}),
		)
		cases := []struct {
			name   string
			filter *qdrant.Filter
			want   []uint64
		}{
			{"must", &qdrant.Filter{Must: []*qdrant.Condition{qdrant.NewMatchKeyword("key", "a"), qdrant.NewMatchInt("version", 2)}}, []uint64{2}},
			{"should", &qdrant.Filter{Should: []*qdrant.Condition{qdrant.NewMatchKeyword("key", "b"), qdrant.NewMatchInt("version", 7)}}, []uint64{3, 4}},
			{"must_not", &qdrant.Filter{MustNot: []*qdrant.Condition{qdrant.NewMatchKeyword("key", "a")}}, []uint64{3, 4, 5}},
			{"array element", &qdrant.Filter{Must: []*qdrant.Condition{qdrant.NewMatchKeyword("tags", "y")}}, []uint64{1}},
			{"keywords", &qdrant.Filter{Must: []*qdrant.Condition{qdrant.NewMatchKeywords("key", "b", "c")}}, []uint64{3, 4}},
			{"keyword on a number", &qdrant.Filter{Must: []*qdrant.Condition{qdrant.NewMatchKeyword("version", "7")}}, []uint64{5}},
			{"range", &qdrant.Filter{Must: []*qdrant.Condition{qdrant.NewRange("version", &qdrant.Range{Gte: qdrant.PtrOf(2.0)})}}, []uint64{2, 4}},
			{"range on a float", &qdrant.Filter{Must: []*qdrant.Condition{qdrant.NewRange("score", &qdrant.Range{Gt: qdrant.PtrOf(2.0)})}}, []uint64{5}},
			{"has_id", &qdrant.Filter{Must: []*qdrant.Condition{qdrant.NewHasID(qdrant.NewIDNum(3), qdrant.NewIDNum(9))}}, []uint64{3}},
			{"is_empty", &qdrant.Filter{Must: []*qdrant.Condition{qdrant.NewIsEmpty("tags")}}, []uint64{2, 3, 4, 5}},
			{"is_empty of a field no point has", &qdrant.Filter{Must: []*qdrant.Condition{qdrant.NewIsEmpty("nothing")}}, []uint64{1, 2, 3, 4, 5}},
			{"is_empty of null", &qdrant.Filter{Must: []*qdrant.Condition{qdrant.NewIsEmpty("note")}}, []uint64{1, 2, 3, 4, 5}},
			{"is_null", &qdrant.Filter{Must: []*qdrant.Condition{qdrant.NewIsNull("note")}}, []uint64{4}},
			{"is_null of a field no point has", &qdrant.Filter{Must: []*qdrant.Condition{qdrant.NewIsNull("nothing")}}, []uint64{}},
			{"nested should of musts", &qdrant.Filter{Should: []*qdrant.Condition{
				qdrant.NewFilterAsCondition(&qdrant.Filter{Must: []*qdrant.Condition{qdrant.NewMatchKeyword("key", "a")}, MustNot: []*qdrant.Condition{qdrant.NewMatchInt("version", 1)}}),
				qdrant.NewFilterAsCondition(&qdrant.Filter{Must: []*qdrant.Condition{qdrant.NewMatchKeyword("key", "c")}}),
			}}, []uint64{2, 4}},
			{"min_should", &qdrant.Filter{MinShould: &qdrant.MinShould{MinCount: 2, Conditions: []*qdrant.Condition{
				qdrant.NewMatchKeyword("key", "a"), qdrant.NewMatchInt("version", 1), qdrant.NewMatchKeyword("tags", "x"),
			}}}, []uint64{1}},
			{"empty should", &qdrant.Filter{Should: []*qdrant.Condition{}}, []uint64{1, 2, 3, 4, 5}},
		}
		for _, tc := range cases {
			got, err := c.Scroll(ctx(), &qdrant.ScrollPoints{CollectionName: docs, Filter: tc.filter, Limit: qdrant.PtrOf(uint32(100))})
			mustOK(t, err)
			if !slices.Equal(ids(got), tc.want) {
				t.Errorf("%s: got %v; want %v", tc.name, ids(got), tc.want)
			}
			if n := count(t, c, docs, tc.filter); int(n) != len(tc.want) {
				t.Errorf("%s: count %d; want %d", tc.name, n, len(tc.want))
			}
		}
	})
}

// A range on a field with an integer index is decided by the index: its
// float bounds are cast to integers (toward zero), integers compare
// exactly above 2^53 too, and a value that is no integer matches no range.
// Without the index the same range compares floats.
func TestRangeOnAnIntegerIndex(t *testing.T) {
	onBoth(t, func(t *testing.T, s server) {
		c := s.connect(t, "")
		docs := s.name("docs")
		create(t, c, docs, 2, qdrant.Distance_Cosine)
		index(t, c, docs, "indexed", qdrant.FieldType_FieldTypeInteger)
		big := int64(1) << 60
		for id, v := range map[uint64]any{1: 1, 2: 2, 3: 2.5, 4: []any{1, 9}, 5: big, 6: big + 1, 7: int64(math.MaxInt64), 8: "2"} {
			upsert(t, c, docs, pt(id, []float32{1, 0}, map[string]any{"indexed": v, "plain": v}))
		}
		bigF := float64(big)
		for _, tc := range []struct {
			name             string
			r                *qdrant.Range
			indexed, unindex []uint64
		}{
			{"lt 2.5", &qdrant.Range{Lt: qdrant.PtrOf(2.5)}, []uint64{1, 4}, []uint64{1, 2, 4}},
			{"lte 2.5", &qdrant.Range{Lte: qdrant.PtrOf(2.5)}, []uint64{1, 2, 4}, []uint64{1, 2, 3, 4}},
			{"gte 1.5", &qdrant.Range{Gte: qdrant.PtrOf(1.5)}, []uint64{1, 2, 4, 5, 6, 7}, []uint64{2, 3, 4, 5, 6, 7}},
			{"gt 2^60", &qdrant.Range{Gt: &bigF}, []uint64{6, 7}, []uint64{7}},
			{"lte 2^60", &qdrant.Range{Lte: &bigF}, []uint64{1, 2, 4, 5}, []uint64{1, 2, 3, 4, 5, 6}},
			{"gte 2^63", &qdrant.Range{Gte: qdrant.PtrOf(math.Ldexp(1, 63))}, []uint64{7}, []uint64{7}},
		} {
			for field, want := range map[string][]uint64{"indexed": tc.indexed, "plain": tc.unindex} {
				filter := &qdrant.Filter{Must: []*qdrant.Condition{qdrant.NewRange(field, tc.r)}}
				got, err := c.Scroll(ctx(), &qdrant.ScrollPoints{CollectionName: docs, Filter: filter, Limit: qdrant.PtrOf(uint32(100))})
				mustOK(t, err)
				if !slices.Equal(ids(got), want) {
					t.Errorf("%s on %s: %v; want %v", tc.name, field, ids(got), want)
				}
			}
		}
	})
}

func TestScrollPages(t *testing.T) {
	onBoth(t, func(t *testing.T, s server) {
		c := s.connect(t, "")
		docs := s.name("docs")
		create(t, c, docs, 2, qdrant.Distance_Cosine)
		for i := uint64(25); i >= 1; i-- {
			upsert(t, c, docs, pt(i, []float32{1, 1}, map[string]any{"odd": i%2 == 1}))
		}
		var all []uint64
		var offset *qdrant.PointId
		pages := 0
		for {
			page, next, err := c.ScrollAndOffset(ctx(), &qdrant.ScrollPoints{CollectionName: docs, Offset: offset, Limit: qdrant.PtrOf(uint32(10)), WithVectors: qdrant.NewWithVectors(true)})
			mustOK(t, err)
			pages++
			all = append(all, ids(page)...)
			for _, p := range page {
				// Qdrant 1.16.3 sends the flat form, not dense.
				v := p.GetVectors().GetVector().GetData() //nolint:staticcheck // see above
				if len(v) != 2 || math.Abs(float64(v[0])-1/math.Sqrt2) > 1e-6 {
					t.Fatalf("stored cosine vector %v is not normalised", p.GetVectors())
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

		// The offset is the first id of the page, whether or not it
		// matches; the next offset is the first matching id after it.
		odd := &qdrant.Filter{Must: []*qdrant.Condition{qdrant.NewMatchBool("odd", true)}}
		page, next, err := c.ScrollAndOffset(ctx(), &qdrant.ScrollPoints{CollectionName: docs, Filter: odd, Offset: qdrant.NewIDNum(4), Limit: qdrant.PtrOf(uint32(3))})
		mustOK(t, err)
		if !slices.Equal(ids(page), []uint64{5, 7, 9}) || next.GetNum() != 11 {
			t.Fatalf("odd ids from 4, 3 of them: %v, next %v; want [5 7 9], next 11", ids(page), next)
		}
		// Integer ids come before UUIDs, and UUIDs in the order of their
		// bytes; a page that takes the last point has no next offset.
		uuids := []string{"ffffffff-0000-0000-0000-000000000000", "00000000-0000-0000-0000-000000000001", "80000000-0000-0000-0000-000000000000"}
		for _, u := range uuids {
			upsert(t, c, docs, &qdrant.PointStruct{Id: qdrant.NewID(u), Vectors: qdrant.NewVectorsDense([]float32{1, 0})})
		}
		page, next, err = c.ScrollAndOffset(ctx(), &qdrant.ScrollPoints{CollectionName: docs, Offset: qdrant.NewIDNum(25), Limit: qdrant.PtrOf(uint32(4))})
		mustOK(t, err)
		var got []string
		for _, p := range page {
			got = append(got, p.GetId().String())
		}
		want := []string{qdrant.NewIDNum(25).String(), qdrant.NewID(uuids[1]).String(), qdrant.NewID(uuids[2]).String(), qdrant.NewID(uuids[0]).String()}
		if !slices.Equal(got, want) || next != nil {
			t.Fatalf("from 25: %v, next %v; want %v and none", got, next, want)
		}
		// Without a limit a page is 10 points.
		page, next, err = c.ScrollAndOffset(ctx(), &qdrant.ScrollPoints{CollectionName: docs})
		mustOK(t, err)
		if len(page) != 10 || next.GetNum() != 11 {
			t.Fatalf("a page without a limit: %d points, next %v; want 10, next 11", len(page), next)
		}
		_, err = c.Scroll(ctx(), &qdrant.ScrollPoints{CollectionName: docs, Limit: qdrant.PtrOf(uint32(0))})
		wantStatus(t, err, codes.InvalidArgument, "Validation error in body: [limit: value 0 invalid, must be 1 or larger]")
	})
}

// Get and Query return no payload unless asked; Scroll does.
func TestPayloadByDefault(t *testing.T) {
	onBoth(t, func(t *testing.T, s server) {
		c := s.connect(t, "")
		docs := s.name("docs")
		create(t, c, docs, 2, qdrant.Distance_Cosine)
		upsert(t, c, docs, pt(1, []float32{1, 0}, map[string]any{"k": "a"}))
		got, err := c.Get(ctx(), &qdrant.GetPoints{CollectionName: docs, Ids: []*qdrant.PointId{qdrant.NewIDNum(1)}})
		mustOK(t, err)
		if len(got) != 1 || len(got[0].GetPayload()) != 0 || got[0].GetVectors() != nil {
			t.Errorf("Get: %v; want the point without payload or vector", got)
		}
		scrolled, err := c.Scroll(ctx(), &qdrant.ScrollPoints{CollectionName: docs})
		mustOK(t, err)
		if len(scrolled) != 1 || scrolled[0].GetPayload()["k"].GetStringValue() != "a" || scrolled[0].GetVectors() != nil {
			t.Errorf("Scroll: %v; want the point with its payload, without vector", scrolled)
		}
		hits, err := c.Query(ctx(), &qdrant.QueryPoints{CollectionName: docs, Query: qdrant.NewQuery(1, 0)})
		mustOK(t, err)
		if len(hits) != 1 || len(hits[0].GetPayload()) != 0 {
			t.Errorf("Query: %v; want the point without payload", hits)
		}
	})
}

func TestQueryRanksByCosine(t *testing.T) {
	onBoth(t, func(t *testing.T, s server) {
		c := s.connect(t, "")
		docs := s.name("docs")
		create(t, c, docs, 2, qdrant.Distance_Cosine)
		upsert(t, c, docs,
			pt(1, []float32{0, 1}, map[string]any{"kind": "x"}),
			pt(2, []float32{1, 0}, map[string]any{"kind": "x"}),
			pt(3, []float32{2, 0}, map[string]any{"kind": "x"}), // same direction as 2
			pt(4, []float32{1, 1}, map[string]any{"kind": "x"}),
			pt(5, []float32{1, 0}, map[string]any{"kind": "y"}),
		)
		hits, err := c.Query(ctx(), &qdrant.QueryPoints{
			CollectionName: docs,
			Query:          qdrant.NewQueryDense([]float32{3, 0}),
			Filter:         &qdrant.Filter{Must: []*qdrant.Condition{qdrant.NewMatchKeyword("kind", "x")}},
			Limit:          qdrant.PtrOf(uint64(3)),
		})
		mustOK(t, err)
		// 2 and 3 tie at 1: Qdrant leaves their order open, the model
		// puts the higher id first.
		got := ids(hits)
		if len(got) != 3 || got[2] != 4 || !slices.Equal(slices.Sorted(slices.Values(got[:2])), []uint64{2, 3}) {
			t.Fatalf("ranking %v; want 2 and 3, then 4", got)
		}
		if s.model != nil && !slices.Equal(got, []uint64{3, 2, 4}) {
			t.Fatalf("model's ranking %v; want [3 2 4], ties by descending id", got)
		}
		if hits[0].GetScore() != 1 || math.Abs(float64(hits[2].GetScore())-1/math.Sqrt2) > 1e-6 {
			t.Fatalf("scores %v, %v; want 1 and 1/sqrt(2)", hits[0].GetScore(), hits[2].GetScore())
		}
		// A score threshold leaves out the scores equal to it.
		for _, tc := range []struct {
			threshold float32
			want      []uint64
		}{
			{0.5, []uint64{2, 3, 4, 5}},
			{hits[2].GetScore(), []uint64{2, 3, 5}},
			{1, nil},
		} {
			hits, err := c.Query(ctx(), &qdrant.QueryPoints{CollectionName: docs, Query: qdrant.NewQueryDense([]float32{1, 0}), ScoreThreshold: &tc.threshold})
			mustOK(t, err)
			if got := slices.Sorted(slices.Values(ids(hits))); !slices.Equal(got, tc.want) {
				t.Fatalf("with threshold %v: %v; want %v", tc.threshold, got, tc.want)
			}
		}
		_, err = c.Query(ctx(), &qdrant.QueryPoints{CollectionName: docs, Query: qdrant.NewQueryDense([]float32{1, 0, 0})})
		wantStatus(t, err, codes.InvalidArgument, "Wrong input: Vector dimension error: expected dim: 2, got 3")
		_, err = c.Query(ctx(), &qdrant.QueryPoints{CollectionName: docs, Query: qdrant.NewQueryID(qdrant.NewIDNum(99))})
		wantStatus(t, err, codes.NotFound, "Not found: No point with id 99 found")
		_, err = c.Query(ctx(), &qdrant.QueryPoints{CollectionName: docs, Query: qdrant.NewQueryDense([]float32{1, 0}), Limit: qdrant.PtrOf(uint64(0))})
		wantCode(t, err, codes.InvalidArgument)
	})
}

func TestAliases(t *testing.T) {
	onBoth(t, func(t *testing.T, s server) {
		c := s.connect(t, "")
		v1, v2, live, current, missing := s.name("v1"), s.name("v2"), s.name("live"), s.name("current"), s.name("missing")
		create(t, c, v1, 2, qdrant.Distance_Cosine)
		create(t, c, v2, 2, qdrant.Distance_Cosine)
		upsert(t, c, v1, pt(1, []float32{1, 0}, nil))
		upsert(t, c, v2, pt(1, []float32{1, 0}, nil), pt(2, []float32{1, 0}, nil))

		mustOK(t, c.CreateAlias(ctx(), live, v1))
		if n := count(t, c, live, nil); n != 1 {
			t.Fatalf("live -> v1 counts %d; want 1", n)
		}
		mustOK(t, c.UpdateAliases(ctx(), []*qdrant.AliasOperations{qdrant.NewAliasDelete(live), qdrant.NewAliasCreate(live, v2)}))
		if n := count(t, c, live, nil); n != 2 {
			t.Fatalf("live -> v2 counts %d; want 2", n)
		}
		// Deleting a missing alias is not an error in Qdrant.
		mustOK(t, c.DeleteAlias(ctx(), s.name("never")))
		err := c.CreateAlias(ctx(), s.name("x"), missing)
		wantStatus(t, err, codes.NotFound, "Not found: Collection `"+missing+"` doesn't exist!")
		wantCode(t, c.CreateAlias(ctx(), s.name("x"), live), codes.NotFound) // an alias of an alias
		err = c.RenameAlias(ctx(), missing, s.name("y"))
		wantStatus(t, err, codes.NotFound, "Not found: Alias "+missing+" does not exists!")
		err = c.CreateAlias(ctx(), v1, v2)
		wantStatus(t, err, codes.AlreadyExists, "Wrong input: Collection `"+v1+"` already exists!")
		err = c.CreateCollection(ctx(), &qdrant.CreateCollection{
			CollectionName: live,
			VectorsConfig:  qdrant.NewVectorsConfig(&qdrant.VectorParams{Size: 2, Distance: qdrant.Distance_Cosine}),
		})
		wantStatus(t, err, codes.InvalidArgument, "Wrong input: Can't create collection with name "+live+". Alias with the same name already exists")
		// Alias names are not checked as collection names are.
		mustOK(t, c.CreateAlias(ctx(), s.name("a/b"), v1))
		mustOK(t, c.DeleteAlias(ctx(), s.name("a/b")))

		// CollectionExists resolves aliases, as Qdrant does; listing a
		// collection's aliases does not, and needs no collection.
		for name, want := range map[string]bool{live: true, v1: true, missing: false} {
			exists, err := c.CollectionExists(ctx(), name)
			mustOK(t, err)
			if exists != want {
				t.Fatalf("CollectionExists(%q) = %v; want %v", name, exists, want)
			}
		}
		for name, want := range map[string]int{v2: 1, live: 0, missing: 0} {
			aliases, err := c.ListCollectionAliases(ctx(), name)
			mustOK(t, err)
			if len(aliases) != want {
				t.Fatalf("ListCollectionAliases(%q) = %v; want %d", name, aliases, want)
			}
		}

		mustOK(t, c.RenameAlias(ctx(), live, current))
		if got := aliasesOn(t, c, s.prefix); !slices.Equal(got, []string{current + " -> " + v2}) {
			t.Fatalf("aliases %v; want current -> v2", got)
		}
		// A delete by an alias's name deletes nothing.
		deleted, err := c.GetCollectionsClient().Delete(ctx(), &qdrant.DeleteCollection{CollectionName: current})
		mustOK(t, err)
		if deleted.GetResult() || count(t, c, current, nil) != 2 {
			t.Fatalf("delete by the alias's name: %v; want false, and nothing deleted", deleted.GetResult())
		}
		// Dropping the collection drops its aliases.
		deleted, err = c.GetCollectionsClient().Delete(ctx(), &qdrant.DeleteCollection{CollectionName: v2})
		mustOK(t, err)
		if !deleted.GetResult() {
			t.Fatalf("delete of %s: false; want true", v2)
		}
		_, err = c.Count(ctx(), &qdrant.CountPoints{CollectionName: current})
		wantCode(t, err, codes.NotFound)
		if got := aliasesOn(t, c, s.prefix); len(got) != 0 {
			t.Fatalf("aliases of a dropped collection survive: %v", got)
		}
		deleted, err = c.GetCollectionsClient().Delete(ctx(), &qdrant.DeleteCollection{CollectionName: v2})
		mustOK(t, err)
		if deleted.GetResult() {
			t.Fatalf("a second delete of %s: true; want false", v2)
		}
	})
}

// aliasesOn lists the aliases whose names start with prefix, as
// "alias -> collection".
func aliasesOn(t *testing.T, c *qdrant.Client, prefix string) []string {
	t.Helper()
	aliases, err := c.ListAliases(ctx())
	mustOK(t, err)
	var out []string
	for _, a := range aliases {
		if strings.HasPrefix(a.GetAliasName(), prefix) {
			out = append(out, a.GetAliasName()+" -> "+a.GetCollectionName())
		}
	}
	slices.Sort(out)
	return out
}

func TestDeleteByFilterAndIDs(t *testing.T) {
	onBoth(t, func(t *testing.T, s server) {
		c := s.connect(t, "")
		docs := s.name("docs")
		create(t, c, docs, 2, qdrant.Distance_Cosine)
		upsert(t, c, docs, pt(1, []float32{1, 0}, map[string]any{"k": "a"}), pt(2, []float32{1, 0}, map[string]any{"k": "b"}),
			pt(3, []float32{1, 0}, map[string]any{"k": "a"}), pt(4, []float32{1, 0}, map[string]any{"v": 1}), pt(5, []float32{1, 0}, map[string]any{"k": "c"}))
		_, err := c.Delete(ctx(), &qdrant.DeletePoints{CollectionName: docs, Wait: qdrant.PtrOf(true),
			Points: qdrant.NewPointsSelectorFilter(&qdrant.Filter{Must: []*qdrant.Condition{qdrant.NewMatchKeyword("k", "a")}})})
		mustOK(t, err)
		_, err = c.Delete(ctx(), &qdrant.DeletePoints{CollectionName: docs, Wait: qdrant.PtrOf(true), Points: qdrant.NewPointsSelector(qdrant.NewIDNum(9), qdrant.NewIDNum(5))})
		mustOK(t, err)
		// is_empty of a field a point lacks selects it.
		_, err = c.Delete(ctx(), &qdrant.DeletePoints{CollectionName: docs, Wait: qdrant.PtrOf(true),
			Points: qdrant.NewPointsSelectorFilter(&qdrant.Filter{Must: []*qdrant.Condition{qdrant.NewIsEmpty("k")}})})
		mustOK(t, err)
		got, err := c.Scroll(ctx(), &qdrant.ScrollPoints{CollectionName: docs})
		mustOK(t, err)
		if !slices.Equal(ids(got), []uint64{2}) {
			t.Fatalf("left %v; want [2]", ids(got))
		}
	})
}

// A failing method answers Unavailable without effect and counts the
// call, until it is cleared; a method the server does not serve panics.
// (The model's own: no Qdrant has it.)
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
// is off, filters on keys without an index of a suitable type, limits and
// batches over its maxima, and filters of more conditions than its limit,
// counting those of nested filters (not the nested filters themselves).
func TestStrictMode(t *testing.T) {
	onBoth(t, func(t *testing.T, s server) {
		c := s.connect(t, "")
		docs := s.name("docs")
		mustOK(t, c.CreateCollection(ctx(), &qdrant.CreateCollection{
			CollectionName: docs,
			VectorsConfig:  qdrant.NewVectorsConfig(&qdrant.VectorParams{Size: 2, Distance: qdrant.Distance_Cosine}),
			StrictModeConfig: &qdrant.StrictModeConfig{Enabled: qdrant.PtrOf(true), SearchAllowExact: qdrant.PtrOf(false),
				UnindexedFilteringRetrieve: qdrant.PtrOf(false), UnindexedFilteringUpdate: qdrant.PtrOf(false),
				MaxQueryLimit: qdrant.PtrOf(uint32(5)), UpsertMaxBatchsize: qdrant.PtrOf(uint64(2)), FilterMaxConditions: qdrant.PtrOf(uint64(2))},
		}))
		info, err := c.GetCollectionInfo(ctx(), docs)
		mustOK(t, err)
		if !info.GetConfig().GetStrictModeConfig().GetEnabled() {
			t.Fatalf("strict mode not reported: %v", info.GetConfig())
		}
		byKey := &qdrant.Filter{Must: []*qdrant.Condition{qdrant.NewMatchKeyword("k", "a")}}
		// A count without the exact flag is exact, as in Qdrant.
		for _, exact := range []*bool{qdrant.PtrOf(true), nil} {
			_, err = c.Count(ctx(), &qdrant.CountPoints{CollectionName: docs, Exact: exact})
			wantStatus(t, err, codes.InvalidArgument, "Bad request: Exact search disabled!. Help: Set exact=false.")
		}
		inexact := qdrant.PtrOf(false)
		_, err = c.Count(ctx(), &qdrant.CountPoints{CollectionName: docs, Exact: inexact})
		mustOK(t, err)
		const unindexed = "Bad request: Index required but not found for \"k\" of one of the following types: [%s]. Help: Create an index for this key or use a different filter."
		_, err = c.Count(ctx(), &qdrant.CountPoints{CollectionName: docs, Filter: byKey, Exact: inexact})
		wantStatus(t, err, codes.InvalidArgument, fmt.Sprintf(unindexed, "keyword"))
		_, err = c.Delete(ctx(), &qdrant.DeletePoints{CollectionName: docs, Points: qdrant.NewPointsSelectorFilter(byKey)})
		wantCode(t, err, codes.InvalidArgument)
		_, err = c.Scroll(ctx(), &qdrant.ScrollPoints{CollectionName: docs, Limit: qdrant.PtrOf(uint32(6))})
		wantStatus(t, err, codes.InvalidArgument, `Bad request: Limit exceeded 6 > 5 for "limit". Help: Reduce the "limit" parameter to or below 5.`)
		_, err = c.Query(ctx(), &qdrant.QueryPoints{CollectionName: docs, Query: qdrant.NewQuery(1, 0)}) // the default limit, 10
		wantCode(t, err, codes.InvalidArgument)
		_, err = c.Upsert(ctx(), &qdrant.UpsertPoints{CollectionName: docs, Points: []*qdrant.PointStruct{
			pt(1, []float32{1, 0}, nil), pt(2, []float32{1, 0}, nil), pt(3, []float32{1, 0}, nil)}})
		wantStatus(t, err, codes.InvalidArgument, `Bad request: Limit exceeded 3 > 2 for "upsert limit". Help: Reduce the "upsert limit" parameter to or below 2.`)
		// An upsert's update_filter is not checked for indexes.
		_, err = c.Upsert(ctx(), &qdrant.UpsertPoints{CollectionName: docs, Wait: qdrant.PtrOf(true), Points: []*qdrant.PointStruct{pt(1, []float32{1, 0}, nil)}, UpdateFilter: byKey})
		mustOK(t, err)

		index(t, c, docs, "k", qdrant.FieldType_FieldTypeKeyword)
		_, err = c.Count(ctx(), &qdrant.CountPoints{CollectionName: docs, Filter: byKey, Exact: inexact})
		mustOK(t, err)
		// A keyword index serves keyword matches and is_empty, not an
		// integer match or a range.
		for _, tc := range []struct {
			cond  *qdrant.Condition
			types string
		}{
			{qdrant.NewIsEmpty("k"), ""},
			{qdrant.NewMatchInt("k", 1), "integer"},
			{qdrant.NewRange("k", &qdrant.Range{Lt: qdrant.PtrOf(1.0)}), "float, integer"},
		} {
			_, err = c.Count(ctx(), &qdrant.CountPoints{CollectionName: docs, Filter: &qdrant.Filter{Must: []*qdrant.Condition{tc.cond}}, Exact: inexact})
			if tc.types == "" {
				mustOK(t, err)
			} else {
				wantStatus(t, err, codes.InvalidArgument, fmt.Sprintf(unindexed, tc.types))
			}
		}
		k := func(v string) *qdrant.Condition { return qdrant.NewMatchKeyword("k", v) }
		nested := func(c ...*qdrant.Condition) *qdrant.Condition {
			return qdrant.NewFilterAsCondition(&qdrant.Filter{Must: c})
		}
		for _, tc := range []struct {
			name       string
			filter     *qdrant.Filter
			conditions int // 0 when within the limit of 2
		}{
			{"three", &qdrant.Filter{Must: []*qdrant.Condition{k("a"), k("b"), k("c")}}, 3},
			{"two in a nested filter", &qdrant.Filter{Should: []*qdrant.Condition{nested(nested(k("a"), k("b")))}}, 0},
			{"three in nested filters", &qdrant.Filter{Should: []*qdrant.Condition{nested(k("a"), k("b")), nested(k("c"))}}, 3},
			{"an empty nested filter and two", &qdrant.Filter{Must: []*qdrant.Condition{nested(), k("a"), k("b")}}, 0},
			{"has_id of three ids", &qdrant.Filter{Must: []*qdrant.Condition{qdrant.NewHasID(qdrant.NewIDNum(1), qdrant.NewIDNum(2), qdrant.NewIDNum(3))}}, 0},
			{"min_should", &qdrant.Filter{Must: []*qdrant.Condition{k("a")}, MinShould: &qdrant.MinShould{MinCount: 1, Conditions: []*qdrant.Condition{k("b"), k("c")}}}, 3},
		} {
			_, err = c.Count(ctx(), &qdrant.CountPoints{CollectionName: docs, Filter: tc.filter, Exact: inexact})
			if tc.conditions == 0 {
				if err != nil {
					t.Errorf("%s: %v; want it within the limit", tc.name, err)
				}
			} else if want := fmt.Sprintf("Bad request: Filter condition limit reached (%d > 2). Help: Reduce the amount of conditions of your filter.", tc.conditions); statusMessage(err) != want {
				t.Errorf("%s: %v; want %q", tc.name, err, want)
			}
		}
		_, err = c.Scroll(ctx(), &qdrant.ScrollPoints{CollectionName: docs, Limit: qdrant.PtrOf(uint32(5))})
		mustOK(t, err)
	})
}

// max_points_count refuses every upsert once the collection holds that
// many points, replacing ones too; deletes go through. Qdrant judges the
// size by a cache that it takes at the collection's creation and again at
// every 32nd check: the batch that passes the limit is written whole, the
// upserts after it until the 32nd check too, and after deletes the upserts
// are refused until the cache is taken again.
func TestStrictModeMaxPointsCount(t *testing.T) {
	onBoth(t, func(t *testing.T, s server) {
		c := s.connect(t, "")
		docs := s.name("docs")
		mustOK(t, c.CreateCollection(ctx(), &qdrant.CreateCollection{
			CollectionName:   docs,
			VectorsConfig:    qdrant.NewVectorsConfig(&qdrant.VectorParams{Size: 2, Distance: qdrant.Distance_Cosine}),
			StrictModeConfig: &qdrant.StrictModeConfig{Enabled: qdrant.PtrOf(true), MaxPointsCount: qdrant.PtrOf(uint64(2))},
		}))
		put := func(id uint64) error {
			_, err := c.Upsert(ctx(), &qdrant.UpsertPoints{CollectionName: docs, Wait: qdrant.PtrOf(true), Points: []*qdrant.PointStruct{pt(id, []float32{0, 1}, nil)}})
			return err
		}
		upsert(t, c, docs, pt(1, []float32{1, 0}, nil), pt(2, []float32{1, 0}, nil), pt(3, []float32{1, 0}, nil)) // check 1
		for check := 2; check < 32; check++ {
			mustOK(t, put(1))
		}
		for _, id := range []uint64{4, 1} { // checks 32 and 33
			wantStatus(t, put(id), codes.InvalidArgument, "Bad request: Max points count limit of 2 reached!")
		}
		_, err := c.Delete(ctx(), &qdrant.DeletePoints{CollectionName: docs, Wait: qdrant.PtrOf(true),
			Points: qdrant.NewPointsSelector(qdrant.NewIDNum(1), qdrant.NewIDNum(2), qdrant.NewIDNum(3))})
		mustOK(t, err)
		for check := 34; check < 64; check++ {
			wantCode(t, put(4), codes.InvalidArgument)
		}
		mustOK(t, put(4)) // check 64 takes the size again
		if n := count(t, c, docs, nil); n != 1 {
			t.Fatalf("count: %d; want 1", n)
		}
	})
}

// Qdrant 1.16.3 does not know optimizers_config.prevent_unoptimized, so a
// collection created with it does not have it; from 1.17 it does.
func TestPreventUnoptimized(t *testing.T) {
	check := func(t *testing.T, c *qdrant.Client, name string, want bool) {
		t.Helper()
		mustOK(t, c.CreateCollection(ctx(), &qdrant.CreateCollection{
			CollectionName:   name,
			VectorsConfig:    qdrant.NewVectorsConfig(&qdrant.VectorParams{Size: 2, Distance: qdrant.Distance_Cosine}),
			OptimizersConfig: &qdrant.OptimizersConfigDiff{PreventUnoptimized: qdrant.PtrOf(true)},
		}))
		info, err := c.GetCollectionInfo(ctx(), name)
		mustOK(t, err)
		if got := info.GetConfig().GetOptimizerConfig().GetPreventUnoptimized(); got != want {
			t.Fatalf("prevent_unoptimized %v; want %v", got, want)
		}
	}
	onBoth(t, func(t *testing.T, s server) { check(t, s.connect(t, ""), s.name("docs"), false) })
	check(t, connect(t, qdranttest.Start(t, qdranttest.WithVersion("1.17.1")), ""), "docs", true)
}

// The read-only key reads everything and writes nothing: each write is
// PermissionDenied with Qdrant's message and leaves the collection, its
// points, indexes and aliases as they were. Point writes and payload index
// creation look the collection up first, as in Qdrant, so on a missing
// collection they are NotFound; collection, alias and index deletions are
// refused whether or not the collection exists. The read-write key still
// writes, and any other key is Unauthenticated.
func TestReadOnlyAPIKey(t *testing.T) {
	onBothKeyed(t, func(t *testing.T, s server) {
		rw, ro := s.connect(t, s.apiKey), s.connect(t, s.readOnlyKey)
		docs, live, missing := s.name("docs"), s.name("live"), s.name("missing")
		create(t, rw, docs, 2, qdrant.Distance_Cosine)
		upsert(t, rw, docs, pt(1, []float32{1, 0}, map[string]any{"k": "a"}))
		mustOK(t, rw.CreateAlias(ctx(), live, docs))

		_, err := ro.GetCollectionInfo(ctx(), live)
		mustOK(t, err)
		_, err = ro.ListCollections(ctx())
		mustOK(t, err)
		_, err = ro.CollectionExists(ctx(), docs)
		mustOK(t, err)
		_, err = ro.ListAliases(ctx())
		mustOK(t, err)
		_, err = ro.Count(ctx(), &qdrant.CountPoints{CollectionName: docs})
		mustOK(t, err)
		_, err = ro.Scroll(ctx(), &qdrant.ScrollPoints{CollectionName: docs})
		mustOK(t, err)
		_, err = ro.Get(ctx(), &qdrant.GetPoints{CollectionName: docs, Ids: []*qdrant.PointId{qdrant.NewIDNum(1)}})
		mustOK(t, err)
		_, err = ro.Query(ctx(), &qdrant.QueryPoints{CollectionName: docs, Query: qdrant.NewQuery(1, 0)})
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
			"CreateAlias":      func(c string) error { return ro.CreateAlias(ctx(), s.name("other"), c) },
			"DeleteAlias":      func(string) error { return ro.DeleteAlias(ctx(), live) },
		}
		resolvedFirst := map[string]bool{"Upsert": true, "Delete by id": true, "Delete by filter": true, "SetPayload": true, "CreateFieldIndex": true}
		for name, write := range writes {
			for _, collection := range []string{docs, live, missing} {
				err := write(collection)
				var st interface{ GRPCStatus() *status.Status }
				if collection == missing && resolvedFirst[name] {
					if want := "Not found: Collection `" + missing + "` doesn't exist!"; !errors.As(err, &st) || st.GRPCStatus().Code() != codes.NotFound ||
						st.GRPCStatus().Message() != want {
						t.Errorf("%s on %s with the read-only key: %v; want NotFound, %s", name, collection, err, want)
					}
					continue
				}
				if !errors.As(err, &st) || st.GRPCStatus().Code() != codes.PermissionDenied ||
					st.GRPCStatus().Message() != "Forbidden: Global manage access is required" {
					t.Errorf("%s on %s with the read-only key: %v; want PermissionDenied, Forbidden: Global manage access is required", name, collection, err)
				}
			}
		}

		info, err := rw.GetCollectionInfo(ctx(), docs)
		mustOK(t, err)
		if n := count(t, rw, docs, nil); n != 1 {
			t.Errorf("count after the refused writes: %d; want 1", n)
		}
		got, err := rw.Get(ctx(), &qdrant.GetPoints{CollectionName: docs, Ids: []*qdrant.PointId{qdrant.NewIDNum(1)}, WithPayload: qdrant.NewWithPayload(true)})
		mustOK(t, err)
		if len(got) != 1 || got[0].GetPayload()["k"].GetStringValue() != "a" {
			t.Errorf("point 1 after the refused writes: %v; want payload k=a", got)
		}
		if len(info.GetPayloadSchema()) != 0 {
			t.Errorf("payload indexes after the refused writes: %v; want none", info.GetPayloadSchema())
		}
		names, err := rw.ListCollections(ctx())
		mustOK(t, err)
		names = slices.DeleteFunc(names, func(n string) bool { return !strings.HasPrefix(n, s.prefix) })
		if !slices.Equal(names, []string{docs}) || !slices.Equal(aliasesOn(t, rw, s.prefix), []string{live + " -> " + docs}) {
			t.Errorf("collections %v and aliases %v after the refused writes; want [docs] and live", names, aliasesOn(t, rw, s.prefix))
		}

		upsert(t, rw, docs, pt(2, []float32{0, 1}, nil))
		_, err = s.connect(t, "wrong").Count(ctx(), &qdrant.CountPoints{CollectionName: docs})
		wantCode(t, err, codes.Unauthenticated)
	})
}

// Keys changed under a running client take effect on its next call: a
// read-write key made read-only may no longer write, and may again once
// restored. (The model's own: a real Qdrant takes new keys at a restart.)
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
