package qdranttest

import (
	"context"
	"math/rand/v2"
	"slices"
	"time"

	"github.com/qdrant/go-client/qdrant"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
)

// defaultLimit is Qdrant's page and result size when a request sets none.
const defaultLimit = 10

type pointsService struct {
	qdrant.UnimplementedPointsServer
	s *Server
}

// updateChunkSize is the number of points Qdrant applies under one lock
// (UPDATE_OP_CHUNK_SIZE in lib/shard/src/update/points/upsert.rs).
const updateChunkSize = 32

// Upsert checks the request (ids, the presence of vectors, the filter)
// before it writes anything, as Qdrant converts the request first; but a
// vector's size is checked only as its point is applied, as in Qdrant
// 1.16.3, where the segment refuses it (upsert_points_impl in
// lib/shard/src/update/points/upsert.rs). Qdrant applies the points in the
// order of a hash map of their ids, seeded at random for each request, in
// chunks of 32, and within a chunk the points that exist before the new
// ones; the server draws such an order too. So a batch with one wrong-size
// vector fails with InvalidArgument after writing an arbitrary part of
// itself, from none of the other points to all of them: which part
// changes from one request to the next, as in Qdrant. (Qdrant 1.18.1
// checks every vector first and writes nothing of such a batch,
// qdrant/qdrant#9058; the server does not model that.)
//
// Without wait, Qdrant answers Acknowledged once it has accepted the
// request, and a failure while applying it reaches no one
// (qdrant/qdrant#9039): the server writes the same part of the batch and
// answers Acknowledged.
//
// With update_filter an existing point is replaced only if it matches the
// filter; absent points are inserted regardless (Qdrant 1.16+).
// update_mode (insert only, update only) is honoured from 1.17 (see
// [WithVersion]); Qdrant 1.16.3 does not know the field and ignores it.
func (ps *pointsService) Upsert(_ context.Context, req *qdrant.UpsertPoints) (*qdrant.PointsOperationResponse, error) {
	start := time.Now()
	if req.ShardKeySelector != nil {
		return nil, unsupported("shard keys")
	}
	if err := checkFilter(req.UpdateFilter); err != nil {
		return nil, err
	}
	s := ps.s
	c, unlock, err := s.locked(req.GetCollectionName(), true)
	if err != nil {
		return nil, err
	}
	defer unlock()
	if err := c.checkStrictUpsert(len(req.GetPoints())); err != nil {
		return nil, err
	}
	incoming := make([]*point, len(req.GetPoints()))
	for i, in := range req.GetPoints() {
		if in.GetId() == nil {
			return nil, status.Error(codes.InvalidArgument, "Empty ID is not allowed")
		}
		id, err := parsePointID(in.GetId())
		if err != nil {
			return nil, err
		}
		vec, err := denseVector(in.GetVectors())
		if err != nil {
			return nil, err
		}
		incoming[i] = &point{id: id, payload: clonePayload(in.GetPayload()), vector: vec}
	}
	// Of points sharing an id the last one is written, as Qdrant keys the
	// batch by id.
	last := make(map[pointID]int, len(incoming))
	for i, p := range incoming {
		last[p.id] = i
	}
	mode := qdrant.UpdateMode_Upsert
	if s.since117() {
		mode = req.GetUpdateMode()
	}
	op := s.nextOperation()
	var kept []*point
	for i, p := range incoming {
		if last[p.id] != i {
			continue
		}
		old, exists := c.points[p.id]
		switch {
		case !exists && mode == qdrant.UpdateMode_UpdateOnly:
			continue
		case exists && mode == qdrant.UpdateMode_InsertOnly:
			continue
		case exists && req.UpdateFilter != nil && !c.matches(req.UpdateFilter, old):
			continue
		}
		kept = append(kept, p)
	}
	// Qdrant's order: a hash map's, seeded for each request.
	rand.Shuffle(len(kept), func(i, j int) { kept[i], kept[j] = kept[j], kept[i] }) //nolint:gosec // an order, not a secret
	if err := c.apply(kept, *op); err != nil && req.GetWait() {
		return nil, err
	}
	return applied(op, req.GetWait(), start), nil
}

// apply writes points in chunks of updateChunkSize, in each chunk the
// points that exist first, as Qdrant does, until a point of the wrong
// size, whose error it returns.
func (c *collection) apply(points []*point, op uint64) error {
	for lo := 0; lo < len(points); lo += updateChunkSize {
		chunk := points[lo:min(lo+updateChunkSize, len(points))]
		for _, existing := range []bool{true, false} {
			for _, p := range chunk {
				if _, ok := c.points[p.id]; ok != existing {
					continue
				}
				if err := checkDim(c, p.vector); err != nil {
					return err
				}
				p.vector = prepare(c, p.vector)
				p.version = op
				c.put(p)
			}
		}
	}
	return nil
}

// Delete removes points by ids (absent ids are ignored) or by filter.
func (ps *pointsService) Delete(_ context.Context, req *qdrant.DeletePoints) (*qdrant.PointsOperationResponse, error) {
	start := time.Now()
	if req.ShardKeySelector != nil {
		return nil, unsupported("shard keys")
	}
	var ids []pointID
	var filter *qdrant.Filter
	switch sel := req.GetPoints().GetPointsSelectorOneOf().(type) {
	case *qdrant.PointsSelector_Points:
		for _, in := range sel.Points.GetIds() {
			id, err := parsePointID(in)
			if err != nil {
				return nil, err
			}
			ids = append(ids, id)
		}
	case *qdrant.PointsSelector_Filter:
		if err := checkFilter(sel.Filter); err != nil {
			return nil, err
		}
		filter = sel.Filter
		if filter == nil {
			filter = &qdrant.Filter{}
		}
	default:
		return nil, status.Error(codes.InvalidArgument, "PointSelector is missing")
	}
	s := ps.s
	c, unlock, err := s.locked(req.GetCollectionName(), true)
	if err != nil {
		return nil, err
	}
	defer unlock()
	if err := c.checkStrictUpdate(filter); err != nil {
		return nil, err
	}
	op := s.nextOperation()
	if filter == nil {
		for _, id := range ids {
			c.remove(id)
		}
		return applied(op, req.GetWait(), start), nil
	}
	var doomed []pointID
	c.candidates(filter, func(p *point) {
		if c.matches(filter, p) {
			doomed = append(doomed, p.id)
		}
	})
	for _, id := range doomed {
		c.remove(id)
	}
	return applied(op, req.GetWait(), start), nil
}

// Get returns the requested points that exist, in request order, without
// their payload unless asked for (unlike Scroll, as in Qdrant).
func (ps *pointsService) Get(_ context.Context, req *qdrant.GetPoints) (*qdrant.GetResponse, error) {
	start := time.Now()
	if req.ShardKeySelector != nil {
		return nil, unsupported("shard keys")
	}
	withVectors, err := vectorsWanted(req.WithVectors)
	if err != nil {
		return nil, err
	}
	ids := make([]pointID, 0, len(req.GetIds()))
	for _, in := range req.GetIds() {
		id, err := parsePointID(in)
		if err != nil {
			return nil, err
		}
		ids = append(ids, id)
	}
	s := ps.s
	c, unlock, err := s.locked(req.GetCollectionName(), false)
	if err != nil {
		return nil, err
	}
	defer unlock()
	seen := make(map[pointID]bool, len(ids))
	var out []*qdrant.RetrievedPoint
	for _, id := range ids {
		p, ok := c.points[id]
		if !ok || seen[id] {
			continue
		}
		seen[id] = true
		out = append(out, retrieved(p, req.WithPayload, false, withVectors))
	}
	return &qdrant.GetResponse{Result: out, Time: since(start)}, nil
}

// Count is always exact, whatever the request's exact flag says: where
// Qdrant estimates an inexact count of a filter from its payload indexes
// (7 where 9 points matched, in one comparison), the server counts
// exactly, so a test must not take an inexact count for a real answer.
// The flag matters to strict mode only: unset, it means exact, as
// Qdrant's gRPC count defaults it to true (count in
// src/tonic/api/query_common.rs, CountRequestInternal::default_exact;
// default_exact_count in older releases).
func (ps *pointsService) Count(_ context.Context, req *qdrant.CountPoints) (*qdrant.CountResponse, error) {
	start := time.Now()
	if req.ShardKeySelector != nil {
		return nil, unsupported("shard keys")
	}
	if err := checkFilter(req.Filter); err != nil {
		return nil, err
	}
	s := ps.s
	c, unlock, err := s.locked(req.GetCollectionName(), false)
	if err != nil {
		return nil, err
	}
	defer unlock()
	if err := c.checkStrictRead(0, req.Filter, req.Exact == nil || req.GetExact()); err != nil {
		return nil, err
	}
	n := uint64(0)
	c.candidates(req.Filter, func(p *point) {
		if c.matches(req.Filter, p) {
			n++
		}
	})
	return &qdrant.CountResponse{Result: &qdrant.CountResult{Count: n}, Time: since(start)}, nil
}

// Scroll pages through the matching points in id order; the offset is the
// first id of the page and next_page_offset the first id of the next one.
func (ps *pointsService) Scroll(_ context.Context, req *qdrant.ScrollPoints) (*qdrant.ScrollResponse, error) {
	start := time.Now()
	switch {
	case req.ShardKeySelector != nil:
		return nil, unsupported("shard keys")
	case req.OrderBy != nil:
		return nil, unsupported("order_by")
	}
	if err := checkFilter(req.Filter); err != nil {
		return nil, err
	}
	withVectors, err := vectorsWanted(req.WithVectors)
	if err != nil {
		return nil, err
	}
	limit := uint32(defaultLimit)
	if req.Limit != nil {
		limit = req.GetLimit()
	}
	if limit == 0 {
		return nil, zeroLimit()
	}
	var from *pointID
	if req.Offset != nil {
		id, err := parsePointID(req.Offset)
		if err != nil {
			return nil, err
		}
		from = &id
	}
	s := ps.s
	c, unlock, err := s.locked(req.GetCollectionName(), false)
	if err != nil {
		return nil, err
	}
	defer unlock()
	if err := c.checkStrictRead(uint64(limit), req.Filter, false); err != nil {
		return nil, err
	}
	var hits []*point
	c.candidates(req.Filter, func(p *point) {
		if (from == nil || comparePointIDs(p.id, *from) >= 0) && c.matches(req.Filter, p) {
			hits = append(hits, p)
		}
	})
	slices.SortFunc(hits, func(a, b *point) int { return comparePointIDs(a.id, b.id) })
	resp := &qdrant.ScrollResponse{}
	if len(hits) > int(limit) {
		resp.NextPageOffset = hits[limit].id.proto()
		hits = hits[:limit]
	}
	for _, p := range hits {
		resp.Result = append(resp.Result, retrieved(p, req.WithPayload, true, withVectors))
	}
	resp.Time = since(start)
	return resp, nil
}

// Query answers a nearest-neighbour query (by vector or by a stored
// point's vector); other query kinds are not modelled.
func (ps *pointsService) Query(_ context.Context, req *qdrant.QueryPoints) (*qdrant.QueryResponse, error) {
	start := time.Now()
	switch {
	case len(req.GetPrefetch()) > 0:
		return nil, unsupported("prefetch")
	case req.LookupFrom != nil:
		return nil, unsupported("lookup_from")
	case req.ShardKeySelector != nil:
		return nil, unsupported("shard keys")
	case req.GetUsing() != "":
		return nil, badInput("Not existing vector name error: %s", req.GetUsing())
	}
	nearest, ok := req.GetQuery().GetVariant().(*qdrant.Query_Nearest)
	if !ok {
		return nil, unsupported("a query other than nearest")
	}
	if err := checkFilter(req.Filter); err != nil {
		return nil, err
	}
	withVectors, err := vectorsWanted(req.WithVectors)
	if err != nil {
		return nil, err
	}
	limit := uint64(defaultLimit)
	if req.Limit != nil {
		limit = req.GetLimit()
	}
	if limit == 0 {
		return nil, zeroLimit()
	}
	s := ps.s
	c, unlock, err := s.locked(req.GetCollectionName(), false)
	if err != nil {
		return nil, err
	}
	defer unlock()
	if err := c.checkStrictRead(limit, req.Filter, false); err != nil {
		return nil, err
	}
	var vec []float32
	switch in := nearest.Nearest.GetVariant().(type) {
	case *qdrant.VectorInput_Dense:
		vec = in.Dense.GetData()
	case *qdrant.VectorInput_Id:
		id, err := parsePointID(in.Id)
		if err != nil {
			return nil, err
		}
		p, ok := c.points[id]
		if !ok {
			return nil, notFound("No point with id %s found", id)
		}
		vec = p.vector
	default:
		return nil, unsupported("a nearest input other than a dense vector or a point id")
	}
	hits, err := search(c, vec, req.Filter, limit, req.GetOffset(), req.ScoreThreshold, req.WithPayload, withVectors)
	if err != nil {
		return nil, err
	}
	return &qdrant.QueryResponse{Result: hits, Time: since(start)}, nil
}

// Search is the older nearest-neighbour call; it shares Query's ranking.
func (ps *pointsService) Search(_ context.Context, req *qdrant.SearchPoints) (*qdrant.SearchResponse, error) {
	start := time.Now()
	switch {
	case req.SparseIndices != nil:
		return nil, unsupported("sparse vectors")
	case req.ShardKeySelector != nil:
		return nil, unsupported("shard keys")
	case req.GetVectorName() != "":
		return nil, badInput("Not existing vector name error: %s", req.GetVectorName())
	case req.GetLimit() == 0:
		return nil, zeroLimit()
	}
	if err := checkFilter(req.Filter); err != nil {
		return nil, err
	}
	withVectors, err := vectorsWanted(req.WithVectors)
	if err != nil {
		return nil, err
	}
	s := ps.s
	c, unlock, err := s.locked(req.GetCollectionName(), false)
	if err != nil {
		return nil, err
	}
	defer unlock()
	if err := c.checkStrictRead(req.GetLimit(), req.Filter, false); err != nil {
		return nil, err
	}
	hits, err := search(c, req.GetVector(), req.Filter, req.GetLimit(), req.GetOffset(), req.ScoreThreshold, req.WithPayload, withVectors)
	if err != nil {
		return nil, err
	}
	return &qdrant.SearchResponse{Result: hits, Time: since(start)}, nil
}

// search ranks every matching point exactly. Equal scores are ordered by
// descending id (Qdrant leaves their order unspecified). A score
// threshold excludes the scores equal to it, as in Qdrant.
func search(c *collection, vec []float32, filter *qdrant.Filter, limit, offset uint64, threshold *float32,
	payload *qdrant.WithPayloadSelector, withVectors bool,
) ([]*qdrant.ScoredPoint, error) {
	if err := checkDim(c, vec); err != nil {
		return nil, err
	}
	q := prepare(c, vec)
	type scored struct {
		p     *point
		score float32
	}
	var all []scored
	for _, p := range c.points {
		if !c.matches(filter, p) {
			continue
		}
		sc := score(c, q, p.vector)
		if threshold != nil && !passes(c, sc, *threshold) {
			continue
		}
		all = append(all, scored{p, sc})
	}
	slices.SortFunc(all, func(a, b scored) int {
		switch {
		case better(c, a.score, b.score):
			return -1
		case better(c, b.score, a.score):
			return 1
		default:
			return comparePointIDs(b.p.id, a.p.id)
		}
	})
	if offset >= uint64(len(all)) {
		return nil, nil
	}
	all = all[offset:]
	if uint64(len(all)) > limit {
		all = all[:limit]
	}
	out := make([]*qdrant.ScoredPoint, len(all))
	for i, h := range all {
		r := retrieved(h.p, payload, false, withVectors)
		out[i] = &qdrant.ScoredPoint{Id: r.Id, Payload: r.Payload, Vectors: r.Vectors, Score: h.score, Version: h.p.version}
	}
	return out, nil
}

// CreateFieldIndex records a payload index; it does not change results,
// as in Qdrant, where indexes only speed filtering up.
func (ps *pointsService) CreateFieldIndex(_ context.Context, req *qdrant.CreateFieldIndexCollection) (*qdrant.PointsOperationResponse, error) {
	start := time.Now()
	if err := checkKey(req.GetFieldName()); err != nil {
		return nil, err
	}
	if req.FieldType == nil {
		return nil, status.Error(codes.InvalidArgument, "cannot convert field_type")
	}
	typ, ok := schemaTypes[req.GetFieldType()]
	if !ok {
		return nil, badInput("unknown field type %v", req.GetFieldType())
	}
	s := ps.s
	c, unlock, err := s.locked(req.GetCollectionName(), true)
	if err != nil {
		return nil, err
	}
	defer unlock()
	c.indexes[req.GetFieldName()] = typ
	return applied(s.nextOperation(), req.GetWait(), start), nil
}

func (ps *pointsService) DeleteFieldIndex(_ context.Context, req *qdrant.DeleteFieldIndexCollection) (*qdrant.PointsOperationResponse, error) {
	start := time.Now()
	s := ps.s
	c, unlock, err := s.locked(req.GetCollectionName(), true)
	if err != nil {
		return nil, err
	}
	defer unlock()
	delete(c.indexes, req.GetFieldName())
	return applied(s.nextOperation(), req.GetWait(), start), nil
}

var schemaTypes = map[qdrant.FieldType]qdrant.PayloadSchemaType{
	qdrant.FieldType_FieldTypeKeyword:  qdrant.PayloadSchemaType_Keyword,
	qdrant.FieldType_FieldTypeInteger:  qdrant.PayloadSchemaType_Integer,
	qdrant.FieldType_FieldTypeFloat:    qdrant.PayloadSchemaType_Float,
	qdrant.FieldType_FieldTypeGeo:      qdrant.PayloadSchemaType_Geo,
	qdrant.FieldType_FieldTypeText:     qdrant.PayloadSchemaType_Text,
	qdrant.FieldType_FieldTypeBool:     qdrant.PayloadSchemaType_Bool,
	qdrant.FieldType_FieldTypeDatetime: qdrant.PayloadSchemaType_Datetime,
	qdrant.FieldType_FieldTypeUuid:     qdrant.PayloadSchemaType_Uuid,
}

// vectorsWanted reads a with_vectors selector (default: no vectors).
func vectorsWanted(sel *qdrant.WithVectorsSelector) (bool, error) {
	switch o := sel.GetSelectorOptions().(type) {
	case nil:
		return false, nil
	case *qdrant.WithVectorsSelector_Enable:
		return o.Enable, nil
	default:
		return false, unsupported("selecting named vectors")
	}
}

// retrieved copies a stored point into a response, with the payload the
// selector asks for (payloadDefault when there is no selector).
func retrieved(p *point, sel *qdrant.WithPayloadSelector, payloadDefault, withVectors bool) *qdrant.RetrievedPoint {
	r := &qdrant.RetrievedPoint{Id: p.id.proto()}
	switch o := sel.GetSelectorOptions().(type) {
	case nil:
		if payloadDefault {
			r.Payload = clonePayload(p.payload)
		}
	case *qdrant.WithPayloadSelector_Enable:
		if o.Enable {
			r.Payload = clonePayload(p.payload)
		}
	case *qdrant.WithPayloadSelector_Include:
		r.Payload = make(map[string]*qdrant.Value)
		for _, f := range o.Include.GetFields() {
			if v, ok := p.payload[f]; ok {
				r.Payload[f] = v
			}
		}
		r.Payload = clonePayload(r.Payload)
	case *qdrant.WithPayloadSelector_Exclude:
		r.Payload = clonePayload(p.payload)
		for _, f := range o.Exclude.GetFields() {
			delete(r.Payload, f)
		}
	}
	if withVectors {
		// In the flat form, which Qdrant 1.16.3 sends, not as dense.
		r.Vectors = &qdrant.VectorsOutput{VectorsOptions: &qdrant.VectorsOutput_Vector{
			Vector: &qdrant.VectorOutput{Data: slices.Clone(p.vector)}, //nolint:staticcheck // the form Qdrant 1.16.3 sends
		}}
	}
	return r
}
