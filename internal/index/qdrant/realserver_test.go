package qdrant_test

import (
	"errors"
	"fmt"
	"net"
	"slices"
	"strconv"
	"strings"
	"testing"

	qd "github.com/qdrant/go-client/qdrant"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	"github.com/converge-sync/converge/internal/index"
	"github.com/converge-sync/converge/internal/index/qdrant"
	"github.com/converge-sync/converge/internal/index/qdranttest"
	"github.com/converge-sync/converge/internal/projector"
	"github.com/converge-sync/converge/internal/testenv"
)

// server is a Qdrant that a test of the backend runs against: the model
// (qdranttest) or a real Qdrant leased from testenv. What Qdrant itself
// defines (its answers, its conditional upsert, aliases, keys, strict
// mode) is tested on both; what needs the model's instruments (Calls,
// MaxInFlight, Fail, Stop, SetAPIKeys, WithVersion) on the model alone.
type server struct {
	model       *qdranttest.Server // nil for a real Qdrant
	addr        string             // gRPC host:port
	apiKey      string             // may write ("" on an open server)
	readOnlyKey string
	prefix      string // of every collection and alias name a test makes
}

func modelServer(t testing.TB, opts ...qdranttest.Option) server {
	m := qdranttest.Start(t, opts...)
	return server{model: m, addr: m.Addr()}
}

func realServer(t testing.TB) server {
	q := testenv.LeaseQdrant(t)
	return server{addr: q.URL, prefix: q.Collection + "_"}
}

// onBoth runs fn against the model and against a real Qdrant.
func onBoth(t *testing.T, fn func(t *testing.T, s server)) {
	t.Helper()
	t.Run("qdranttest", func(t *testing.T) { fn(t, modelServer(t)) })
	t.Run("qdrant", func(t *testing.T) { fn(t, realServer(t)) })
}

// onBothKeyed runs fn against servers that require an API key and have a
// read-only one.
func onBothKeyed(t *testing.T, fn func(t *testing.T, s server)) {
	t.Helper()
	t.Run("qdranttest", func(t *testing.T) {
		s := modelServer(t, qdranttest.WithAPIKey("rw"), qdranttest.WithReadOnlyAPIKey("ro"))
		s.apiKey, s.readOnlyKey = "rw", "ro"
		fn(t, s)
	})
	t.Run("qdrant", func(t *testing.T) {
		q := testenv.LeaseQdrantKeyed(t)
		fn(t, server{addr: q.URL, apiKey: q.APIKey, readOnlyKey: q.ReadOnlyKey, prefix: q.Collection + "_"})
	})
}

// name is the collection or alias called n on s: on a real server, which
// other tests share, under the test's own prefix.
func (s server) name(n string) string { return s.prefix + n }

// collection is the collection of s's backends unless a test says
// otherwise: "converge_chunks", the default, on the model.
func (s server) collection() string { return s.name("converge_chunks") }

// open returns a backend on s, on its collection with its read-write
// key; edit adjusts the configuration.
func (s server) open(t testing.TB, edit func(*qdrant.Config)) *qdrant.Backend {
	t.Helper()
	cfg := qdrant.Config{Addr: s.addr, APIKey: s.apiKey, Collection: s.collection()}
	if edit != nil {
		edit(&cfg)
	}
	b, err := qdrant.New(ctx(), cfg)
	if err != nil {
		t.Fatalf("New: %v", err)
	}
	t.Cleanup(func() { _ = b.Close() })
	return b
}

// ensured returns a backend on s with its collection created.
func (s server) ensured(t testing.TB, edit func(*qdrant.Config)) *qdrant.Backend {
	t.Helper()
	b := s.open(t, edit)
	must(t, b.Ensure(ctx(), dim))
	return b
}

// client is the official client on s, with its read-write key.
func (s server) client(t testing.TB) *qd.Client {
	t.Helper()
	host, portText, err := net.SplitHostPort(s.addr)
	must(t, err)
	port, err := strconv.Atoi(portText)
	must(t, err)
	c, err := qd.NewClient(&qd.Config{Host: host, Port: port, APIKey: s.apiKey, SkipCompatibilityCheck: true})
	must(t, err)
	t.Cleanup(func() { _ = c.Close() })
	return c
}

// createWith makes s's collection as an operator (or a server's
// defaults) would, before the backend's Ensure finds it.
func (s server) createWith(t testing.TB, req *qd.CreateCollection) {
	t.Helper()
	req.CollectionName = s.collection()
	req.VectorsConfig = qd.NewVectorsConfig(&qd.VectorParams{Size: dim, Distance: qd.Distance_Cosine})
	must(t, s.client(t).CreateCollection(ctx(), req))
}

// TestWrongSizeVectorInBatch sends to a real Qdrant, through the official
// client as the backend does, batches of 40 points of which one has a
// vector of the wrong size. Each request fails; what Qdrant has written of
// the batch by then depends on its version. Before 1.18.1 it applies the
// points in chunks of 32 in an order of its own (a hash map's, seeded for
// each request) and stops at the wrong vector, leaving written the points
// it applied before: on 1.16.3, over 200 such requests, every count from
// 0 to 39 came up, about equally often. So one request proves little
// either way: several are sent, to fresh collections, and at least one
// must have written part of its batch (each writes nothing 1 time in 40).
// From 1.18.1 Qdrant checks every vector before it writes anything
// (qdrant/qdrant#9058), and no request may write a point.
//
// The backend checks the sizes itself and sends nothing of such a batch,
// on either server. (The model is held to Qdrant's chunks in
// qdranttest's TestUpsertAppliesChunksUntilAWrongSizeVector.)
func TestWrongSizeVectorInBatch(t *testing.T) {
	t.Run("official client", func(t *testing.T) {
		s := realServer(t)
		c := s.client(t)
		reply, err := c.HealthCheck(ctx())
		must(t, err)
		validatesFirst := !versionBefore(t, reply.GetVersion(), 1, 18, 1)
		const size, wrong, tries = 40, 23, 6
		var written []int
		for try := range tries {
			collection := s.name(fmt.Sprintf("wrong_size_%d", try))
			must(t, c.CreateCollection(ctx(), &qd.CreateCollection{CollectionName: collection,
				VectorsConfig: qd.NewVectorsConfig(&qd.VectorParams{Size: dim, Distance: qd.Distance_Cosine})}))
			batch := make([]*qd.PointStruct, size)
			for i := range batch {
				vec := axis(i)
				if i == wrong {
					vec = make([]float32, dim+1)
					vec[0] = 1
				}
				batch[i] = &qd.PointStruct{Id: qd.NewIDNum(uint64(i)), Vectors: qd.NewVectorsDense(vec),
					Payload: qd.NewValueMap(map[string]any{"n": i})}
			}
			_, err := c.Upsert(ctx(), &qd.UpsertPoints{CollectionName: collection, Wait: qd.PtrOf(true), Points: batch})
			var st interface{ GRPCStatus() *status.Status }
			if want := fmt.Sprintf("Wrong input: Vector dimension error: expected dim: %d, got %d", dim, dim+1); !errors.As(err, &st) ||
				st.GRPCStatus().Code() != codes.InvalidArgument || st.GRPCStatus().Message() != want {
				t.Fatalf("upsert of a batch with a wrong-size vector: %v; want InvalidArgument, %s", err, want)
			}
			got, err := c.Scroll(ctx(), &qd.ScrollPoints{CollectionName: collection, Limit: qd.PtrOf(uint32(100)),
				WithPayload: qd.NewWithPayload(true), WithVectors: qd.NewWithVectors(true)})
			must(t, err)
			for _, p := range got {
				id := int(p.GetId().GetNum())
				vec := p.GetVectors().GetVector().GetData() //nolint:staticcheck // the form Qdrant 1.16.3 sends
				if dense := p.GetVectors().GetVector().GetDense(); dense != nil {
					vec = dense.GetData()
				}
				if id == wrong || p.GetPayload()["n"].GetIntegerValue() != int64(id) || !slices.Equal(vec, axis(id)) {
					t.Fatalf("point %d written as %v; want only whole points of the batch, never the wrong one", id, p)
				}
			}
			written = append(written, len(got))
			must(t, c.DeleteCollection(ctx(), collection))
		}
		t.Logf("Qdrant %s wrote %v of each batch of %d before refusing it", reply.GetVersion(), written, size)
		partial := slices.ContainsFunc(written, func(n int) bool { return n > 0 })
		switch {
		case validatesFirst && partial:
			t.Fatalf("Qdrant %s wrote %v of batches it refused; from 1.18.1 it checks the batch first and writes nothing", reply.GetVersion(), written)
		case !validatesFirst && !partial:
			t.Fatalf("Qdrant %s wrote nothing of %d batches it refused; before 1.18.1 it writes the points it reaches before the wrong one", reply.GetVersion(), tries)
		}
	})

	t.Run("backend", func(t *testing.T) { onBoth(t, testWrongSizeVectorRefused) })
}

// testWrongSizeVectorRefused: the backend refuses a batch with a
// wrong-size vector before it sends anything, and nothing is written.
func testWrongSizeVectorRefused(t *testing.T, s server) {
	b := s.ensured(t, func(c *qdrant.Config) { c.BatchSize = 100 })
	var points []index.Point
	for o := range 60 {
		points = append(points, chunk("a", 1, o, axis(o)))
	}
	points[45].Vector = make([]float32, dim+1)
	err := b.Upsert(ctx(), points)
	var de *qdrant.PointDimensionError
	if !errors.As(err, &de) || !errors.Is(err, qdrant.ErrDimensionMismatch) || !projector.IsPermanent(err) ||
		de.Point != points[45].ID || de.Have != dim+1 || de.Want != dim {
		t.Fatalf("upsert with one wrong-size vector: %v; want a permanent *PointDimensionError naming the point", err)
	}
	counts, err := b.Counts(ctx(), []string{"a"})
	must(t, err)
	if counts["a"] != 0 {
		t.Fatalf("%d points written; want none", counts["a"])
	}
	if s.model != nil && s.model.Calls("Points/Upsert") != 0 {
		t.Fatalf("%d upsert requests sent; want none", s.model.Calls("Points/Upsert"))
	}
}

// versionBefore reports whether version ("1.16.3") is before
// major.minor.patch.
func versionBefore(t *testing.T, version string, major, minor, patch int) bool {
	t.Helper()
	var got [3]int
	parts := strings.SplitN(strings.TrimPrefix(version, "v"), ".", 3)
	for i := range got {
		if i >= len(parts) {
			break
		}
		digits := parts[i]
		if end := strings.IndexFunc(digits, func(r rune) bool { return r < '0' || r > '9' }); end >= 0 {
			digits = digits[:end]
		}
		n, err := strconv.Atoi(digits)
		if err != nil {
			t.Fatalf("Qdrant reports version %q: %v", version, err)
		}
		got[i] = n
	}
	return slices.Compare(got[:], []int{major, minor, patch}) < 0
}

// Chunk points written before they carried version_high and version_low
// (an upgraded collection) are still deleted by DeleteStale when older
// than the kept version, and only then; the ones written since are
// compared exactly.
func TestDeleteStaleOfPointsWithoutVersionParts(t *testing.T) {
	onBoth(t, func(t *testing.T, s server) {
		b := s.ensured(t, nil)
		var legacy []*qd.PointStruct
		for v := int64(1); v <= 3; v++ {
			p := chunk("old", v, 0, axis(0))
			legacy = append(legacy, &qd.PointStruct{
				Id:      qd.NewIDUUID(p.ID.String()),
				Vectors: qd.NewVectorsDense(p.Vector),
				Payload: qd.NewValueMap(map[string]any{"type": "chunk", "key": p.Key, "version": p.Version, "ordinal": 0, "text": p.Text}),
			})
		}
		_, err := s.client(t).Upsert(ctx(), &qd.UpsertPoints{CollectionName: s.collection(), Wait: qd.PtrOf(true), Points: legacy})
		must(t, err)
		must(t, b.Upsert(ctx(), []index.Point{chunk("old", 4, 0, axis(1))}))
		must(t, b.DeleteStale(ctx(), []index.Keep{{Key: "old", Version: 3}}))
		got, err := b.Points(ctx(), "old", false)
		must(t, err)
		if want := []string{"v3#0", "v4#0"}; !slices.Equal(versionsOf(got), want) {
			t.Fatalf("after DeleteStale of versions below 3: %v, want %v", versionsOf(got), want)
		}
		// Beyond 2^53, where a float comparison would not do.
		const big = int64(1)<<55 + 5
		var huge []*qd.PointStruct
		for v := big - 1; v <= big; v++ {
			p := chunk("huge", v, 0, axis(0))
			huge = append(huge, &qd.PointStruct{
				Id:      qd.NewIDUUID(p.ID.String()),
				Vectors: qd.NewVectorsDense(p.Vector),
				Payload: qd.NewValueMap(map[string]any{"type": "chunk", "key": p.Key, "version": p.Version, "ordinal": 0, "text": p.Text}),
			})
		}
		_, err = s.client(t).Upsert(ctx(), &qd.UpsertPoints{CollectionName: s.collection(), Wait: qd.PtrOf(true), Points: huge})
		must(t, err)
		must(t, b.Upsert(ctx(), []index.Point{chunk("huge", big+1, 0, axis(1))}))
		must(t, b.DeleteStale(ctx(), []index.Keep{{Key: "huge", Version: big + 1}}))
		got, err = b.Points(ctx(), "huge", false)
		must(t, err)
		if len(got) != 1 || got[0].Version != big+1 {
			t.Fatalf("after DeleteStale of versions below 2^55+6: %v, want only 2^55+6", versionsOf(got))
		}
	})
}

// A collection the backend creates takes the configured shards; on a
// single server replication and write consistency of one are what it can
// keep. (A cluster's replication is not exercised here: one server.)
func TestCreatedCollectionHasTheConfiguredShards(t *testing.T) {
	s := realServer(t)
	b := s.open(t, func(c *qdrant.Config) { c.Shards, c.Replication, c.WriteConsistency = 3, 1, 1 })
	must(t, b.Ensure(ctx(), dim))
	info, err := s.client(t).GetCollectionInfo(ctx(), s.collection())
	if err != nil {
		t.Fatal(err)
	}
	p := info.GetConfig().GetParams()
	if p.GetShardNumber() != 3 || p.GetReplicationFactor() != 1 || p.GetWriteConsistencyFactor() != 1 {
		t.Errorf("collection params %v: want 3 shards, replication 1, write consistency 1", p)
	}
}
