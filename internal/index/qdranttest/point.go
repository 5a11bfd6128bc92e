package qdranttest

import (
	"bytes"
	"cmp"
	"math"
	"strconv"

	"github.com/google/uuid"
	"github.com/qdrant/go-client/qdrant"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/proto"
)

// pointID is a point id in comparable form. Qdrant orders integer ids
// before UUIDs, and UUIDs by their 128-bit value.
type pointID struct {
	isUUID bool
	num    uint64
	uuid   uuid.UUID
}

func comparePointIDs(a, b pointID) int {
	switch {
	case a.isUUID != b.isUUID:
		if a.isUUID {
			return 1
		}
		return -1
	case a.isUUID:
		return bytes.Compare(a.uuid[:], b.uuid[:])
	default:
		return cmp.Compare(a.num, b.num)
	}
}

// parsePointID accepts the UUID forms Qdrant accepts (hyphenated, simple,
// braced, urn) and integer ids.
func parsePointID(id *qdrant.PointId) (pointID, error) {
	switch v := id.GetPointIdOptions().(type) {
	case *qdrant.PointId_Num:
		return pointID{num: v.Num}, nil
	case *qdrant.PointId_Uuid:
		u, err := uuid.Parse(v.Uuid)
		if err != nil {
			return pointID{}, status.Errorf(codes.InvalidArgument, "Unable to parse UUID: %s", v.Uuid)
		}
		return pointID{isUUID: true, uuid: u}, nil
	default:
		return pointID{}, status.Error(codes.InvalidArgument, "No ID options provided")
	}
}

func (id pointID) String() string {
	if id.isUUID {
		return id.uuid.String()
	}
	return strconv.FormatUint(id.num, 10)
}

func (id pointID) proto() *qdrant.PointId {
	if id.isUUID {
		return qdrant.NewIDUUID(id.uuid.String())
	}
	return qdrant.NewIDNum(id.num)
}

// point is a stored point. Its payload and vector are never shared with a
// request or a response.
type point struct {
	id      pointID
	payload map[string]*qdrant.Value
	vector  []float32
	version uint64 // the operation that wrote it
}

func clonePayload(in map[string]*qdrant.Value) map[string]*qdrant.Value {
	out := make(map[string]*qdrant.Value, len(in))
	for k, v := range in {
		out[k] = proto.CloneOf(v)
	}
	return out
}

// denseVector extracts the one unnamed dense vector of a point. A map of
// named vectors is accepted only for the default (empty) name.
func denseVector(v *qdrant.Vectors) ([]float32, error) {
	switch o := v.GetVectorsOptions().(type) {
	case *qdrant.Vectors_Vector:
		return vectorData(o.Vector)
	case *qdrant.Vectors_Vectors:
		for name, vec := range o.Vectors.GetVectors() {
			if name != "" {
				return nil, badInput("Not existing vector name error: %s", name)
			}
			return vectorData(vec)
		}
	}
	return nil, status.Error(codes.InvalidArgument, "Expected some vectors")
}

func vectorData(v *qdrant.Vector) ([]float32, error) {
	switch o := v.GetVector().(type) {
	case *qdrant.Vector_Dense:
		return o.Dense.GetData(), nil
	case nil:
		// The deprecated flat form, which older clients send: data
		// without indices or a count.
		if v.GetIndices() != nil || v.GetVectorsCount() != 0 { //nolint:staticcheck // see above
			return nil, unsupported("sparse and multi vectors")
		}
		return v.GetData(), nil //nolint:staticcheck // see above
	default:
		return nil, unsupported("sparse, multi and inference vectors")
	}
}

func checkDim(c *collection, v []float32) error {
	if len(v) != c.dim {
		return badInput("Vector dimension error: expected dim: %d, got %d", c.dim, len(v))
	}
	return nil
}

// prepare turns a request vector into its stored form: Qdrant normalises
// vectors of cosine collections on write (and returns them normalised).
func prepare(c *collection, v []float32) []float32 {
	out := make([]float32, len(v))
	copy(out, v)
	if c.distance == qdrant.Distance_Cosine {
		normalize(out)
	}
	return out
}

func normalize(v []float32) {
	var sum float32
	for _, x := range v {
		sum += x * x
	}
	n := float32(math.Sqrt(float64(sum)))
	if n < math.SmallestNonzeroFloat32 || math.IsNaN(float64(n)) {
		return
	}
	for i := range v {
		v[i] /= n
	}
}

// score is the query's similarity to p under the collection's distance; q
// is already prepared. Higher is better except for Euclid and Manhattan,
// whose score is the distance itself (see better).
func score(c *collection, q, p []float32) float32 {
	var s float32
	switch c.distance {
	case qdrant.Distance_Euclid:
		for i := range q {
			d := q[i] - p[i]
			s += d * d
		}
		return float32(math.Sqrt(float64(s)))
	case qdrant.Distance_Manhattan:
		for i := range q {
			s += float32(math.Abs(float64(q[i] - p[i])))
		}
		return s
	default: // cosine on normalised vectors, or dot
		for i := range q {
			s += q[i] * p[i]
		}
		return s
	}
}

// better reports whether score a ranks before score b.
func better(c *collection, a, b float32) bool {
	if c.distance == qdrant.Distance_Euclid || c.distance == qdrant.Distance_Manhattan {
		return a < b
	}
	return a > b
}

// passes reports whether a score is past a score threshold: strictly, as
// in Qdrant, where a score equal to the threshold is left out.
func passes(c *collection, s, threshold float32) bool {
	if c.distance == qdrant.Distance_Euclid || c.distance == qdrant.Distance_Manhattan {
		return s < threshold
	}
	return s > threshold
}
