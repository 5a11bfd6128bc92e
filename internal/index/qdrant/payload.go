package qdrant

import (
	"fmt"

	"github.com/google/uuid"
	qd "github.com/qdrant/go-client/qdrant"

	"github.com/converge-sync/converge/internal/index"
	"github.com/converge-sync/converge/pkg/contract"
)

func chunkPoint(p index.Point) *qd.PointStruct {
	tags := make([]*qd.Value, len(p.Tags))
	for i, t := range p.Tags {
		tags[i] = qd.NewValueString(t)
	}
	return &qd.PointStruct{
		Id:      qd.NewIDUUID(p.ID.String()),
		Vectors: qd.NewVectorsDense(p.Vector),
		Payload: map[string]*qd.Value{
			fieldType:        qd.NewValueString(typeChunk),
			fieldKey:         qd.NewValueString(p.Key),
			fieldVersion:     qd.NewValueInt(p.Version),
			fieldVersionHigh: qd.NewValueInt(p.Version >> 32),
			fieldVersionLow:  qd.NewValueInt(p.Version & 0xffffffff),
			fieldOrdinal:     qd.NewValueInt(int64(p.Ordinal)),
			fieldContentHash: qd.NewValueString(p.ContentHash),
			fieldChunkHash:   qd.NewValueString(p.ChunkHash),
			fieldTitle:       qd.NewValueString(p.Title),
			fieldTags:        qd.NewValueFromList(tags...),
			fieldText:        qd.NewValueString(p.Text),
		},
	}
}

// decodeChunk reads a chunk point back; vectors is nil when none were
// asked for.
func decodeChunk(id *qd.PointId, payload map[string]*qd.Value, vectors *qd.VectorsOutput) (index.Point, error) {
	u, err := pointUUID(id)
	if err != nil {
		return index.Point{}, err
	}
	if t := payload[fieldType].GetStringValue(); t != typeChunk {
		return index.Point{}, fmt.Errorf("qdrant: point %s is a %q point, not a chunk", u, t)
	}
	p := index.Point{
		ID:          u,
		Key:         payload[fieldKey].GetStringValue(),
		Version:     payload[fieldVersion].GetIntegerValue(),
		Ordinal:     int(payload[fieldOrdinal].GetIntegerValue()),
		ContentHash: payload[fieldContentHash].GetStringValue(),
		ChunkHash:   payload[fieldChunkHash].GetStringValue(),
		Title:       payload[fieldTitle].GetStringValue(),
		Text:        payload[fieldText].GetStringValue(),
	}
	if list := payload[fieldTags].GetListValue().GetValues(); len(list) > 0 {
		p.Tags = make([]string, len(list))
		for i, v := range list {
			p.Tags[i] = v.GetStringValue()
		}
	}
	if vectors != nil {
		p.Vector = denseOutput(vectors.GetVector())
	}
	return p, nil
}

// denseOutput reads a returned vector in either of its wire forms.
func denseOutput(v *qd.VectorOutput) []float32 {
	if d := v.GetDense(); d != nil {
		return d.GetData()
	}
	return v.GetData() //nolint:staticcheck // the flat form older servers send
}

// markerPoint is the marker of m. Its vector is the fixed unit vector,
// since the collection requires one; searches never see it.
func markerPoint(m index.Marker, dim int) *qd.PointStruct {
	return &qd.PointStruct{
		Id:      markerID(m.Key),
		Vectors: fixedVector(dim),
		Payload: map[string]*qd.Value{
			fieldType:        qd.NewValueString(typeMarker),
			fieldKey:         qd.NewValueString(m.Key),
			fieldVersion:     qd.NewValueInt(m.Version),
			fieldVersionHigh: qd.NewValueInt(m.Version >> 32),
			fieldVersionLow:  qd.NewValueInt(m.Version & 0xffffffff),
			fieldDeleted:     qd.NewValueBool(m.Deleted),
			fieldContentHash: qd.NewValueString(m.ContentHash),
		},
	}
}

// fixedVector is the unit vector along the first axis, the vector of the
// points that are no chunks (markers, the embedder's), which the
// collection requires and searches never see.
func fixedVector(dim int) *qd.Vectors {
	vec := make([]float32, dim)
	vec[0] = 1
	return qd.NewVectorsDense(vec)
}

func markerID(key string) *qd.PointId {
	return qd.NewIDUUID(contract.DocumentID(key).String())
}

func decodeMarker(id *qd.PointId, payload map[string]*qd.Value) (index.Marker, error) {
	if t := payload[fieldType].GetStringValue(); t != typeMarker {
		u, _ := pointUUID(id)
		return index.Marker{}, fmt.Errorf("qdrant: point %s is a %q point, not a marker", u, t)
	}
	return index.Marker{
		Key:         payload[fieldKey].GetStringValue(),
		Version:     payload[fieldVersion].GetIntegerValue(),
		Deleted:     payload[fieldDeleted].GetBoolValue(),
		ContentHash: payload[fieldContentHash].GetStringValue(),
	}, nil
}

func pointUUID(id *qd.PointId) (uuid.UUID, error) {
	s, ok := id.GetPointIdOptions().(*qd.PointId_Uuid)
	if !ok {
		return uuid.UUID{}, fmt.Errorf("qdrant: point id %v is not a UUID", id)
	}
	u, err := uuid.Parse(s.Uuid)
	if err != nil {
		return uuid.UUID{}, fmt.Errorf("qdrant: point id %q: %w", s.Uuid, err)
	}
	return u, nil
}

// olderMarker matches the stored marker of m when its version is lower
// than m's.
func olderMarker(m index.Marker) *qd.Condition {
	return qd.NewFilterAsCondition(&qd.Filter{
		Must: []*qd.Condition{qd.NewHasID(markerID(m.Key)), olderThan(m.Version)},
	})
}

// olderThan matches a point whose version is lower than v: (high < H) or
// (high == H and low < L), exact for every int64 version, where a float
// range on the version would round above 2^53.
func olderThan(v int64) *qd.Condition {
	high, low := float64(v>>32), float64(v&0xffffffff)
	return qd.NewFilterAsCondition(&qd.Filter{Should: []*qd.Condition{
		qd.NewRange(fieldVersionHigh, &qd.Range{Lt: &high}),
		qd.NewFilterAsCondition(&qd.Filter{Must: []*qd.Condition{
			qd.NewMatchInt(fieldVersionHigh, v>>32),
			qd.NewRange(fieldVersionLow, &qd.Range{Lt: &low}),
		}}),
	}})
}

// olderChunkThan matches a chunk point whose version is lower than v.
// Chunk points written before they carried version_high and version_low
// have only version: of those, every version but v itself matches, as
// before they had the parts (they are all from before the upgrade, and
// none of them newer than the marker that the writes since were checked
// against).
func olderChunkThan(v int64) *qd.Condition {
	return qd.NewFilterAsCondition(&qd.Filter{Should: []*qd.Condition{
		olderThan(v),
		qd.NewFilterAsCondition(&qd.Filter{
			Must:    []*qd.Condition{qd.NewIsEmpty(fieldVersionHigh)},
			MustNot: []*qd.Condition{qd.NewMatchInt(fieldVersion, v)},
		}),
	}})
}

// chunksOf selects the chunk points of key.
func chunksOf(key string) *qd.Filter {
	return &qd.Filter{Must: []*qd.Condition{
		qd.NewMatchKeyword(fieldKey, key),
		qd.NewMatchKeyword(fieldType, typeChunk),
	}}
}

// staleChunks selects the chunk points of k.Key whose version is lower
// than k.Version (all of them when it is 0).
func staleChunks(k index.Keep) *qd.Filter {
	f := chunksOf(k.Key)
	if k.Version != 0 {
		f.Must = append(f.Must, olderChunkThan(k.Version))
	}
	return f
}

// versionChunks selects the chunk points of k.Key of version k.Version.
func versionChunks(k index.Keep) *qd.Filter {
	f := chunksOf(k.Key)
	f.Must = append(f.Must, qd.NewMatchInt(fieldVersion, k.Version))
	return f
}

// onlyType selects the points of one kind, "chunk" or "marker".
func onlyType(t string) *qd.Filter {
	return &qd.Filter{Must: []*qd.Condition{qd.NewMatchKeyword(fieldType, t)}}
}
