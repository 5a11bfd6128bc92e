package qdranttest

import (
	"fmt"
	"slices"
	"strings"

	"github.com/qdrant/go-client/qdrant"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/proto"
)

// Strict mode, as Qdrant enforces it on a collection whose
// strict_mode_config is enabled (StrictModeVerification in
// lib/collection/src/operations/verification/mod.rs, with count.rs and
// update.rs beside it). Every refusal is a CollectionError::StrictMode,
// which reaches the client as InvalidArgument ("Bad request: ..."). Of its
// settings the server enforces max_query_limit, unindexed_filtering_retrieve
// and unindexed_filtering_update, search_allow_exact (on counts),
// upsert_max_batchsize, filter_max_conditions and max_points_count; the
// others are stored and reported only. As in Qdrant 1.16.3, the
// update_filter of an upsert is not checked against the indexes.

// strictMode is the collection's config when strict mode is enabled, nil
// otherwise.
func (c *collection) strictMode() *qdrant.StrictModeConfig {
	if c.strict.GetEnabled() {
		return c.strict
	}
	return nil
}

func strictError(description, help string) error {
	return status.Errorf(codes.InvalidArgument, "Bad request: %s. Help: %s", description, help)
}

// checkLimit is check_limit_opt: a value over the limit is refused.
func checkLimit(value uint64, limit *uint64, name string) error {
	if limit == nil || value <= *limit {
		return nil
	}
	return strictError(fmt.Sprintf("Limit exceeded %d > %d for %q", value, *limit, name),
		fmt.Sprintf("Reduce the %q parameter to or below %d.", name, *limit))
}

func optU32(v *uint32) *uint64 {
	if v == nil {
		return nil
	}
	return proto.Uint64(uint64(*v))
}

// checkStrictRead checks a read: its limit (0 when it has none), its filter
// against the indexes when unindexed_filtering_retrieve is false, and for a
// count its exact flag against search_allow_exact.
func (c *collection) checkStrictRead(limit uint64, filter *qdrant.Filter, exact bool) error {
	sm := c.strictMode()
	if sm == nil {
		return nil
	}
	if limit > 0 {
		if err := checkLimit(limit, optU32(sm.MaxQueryLimit), "limit"); err != nil {
			return err
		}
	}
	if err := c.checkStrictFilter(filter, sm.UnindexedFilteringRetrieve); err != nil {
		return err
	}
	if exact && sm.SearchAllowExact != nil && !sm.GetSearchAllowExact() {
		return strictError("Exact search disabled!", "Set exact=false.")
	}
	return nil
}

// checkStrictUpdate checks a filtered update (a delete by filter).
func (c *collection) checkStrictUpdate(filter *qdrant.Filter) error {
	if sm := c.strictMode(); sm != nil {
		return c.checkStrictFilter(filter, sm.UnindexedFilteringUpdate)
	}
	return nil
}

// checkStrictUpsert checks the size of an upsert batch, then the size of
// the collection: once it holds max_points_count points every upsert is
// refused, even one that only replaces points, until points are deleted or
// the limit is raised. Qdrant refuses it as a plain bad request, without
// help text (check_collection_size_limit in lib/collection/src/operations/
// verification/update.rs), and judges the size by a cache of it (see
// sizeStatsCache), so the refusal comes only some upserts after the limit
// is reached.
func (c *collection) checkStrictUpsert(n int) error {
	sm := c.strictMode()
	if sm == nil {
		return nil
	}
	if err := checkLimit(uint64(n), sm.UpsertMaxBatchsize, "upsert limit"); err != nil {
		return err
	}
	if sm.MaxPointsCount == nil && sm.MaxCollectionVectorSizeBytes == nil && sm.MaxCollectionPayloadSizeBytes == nil {
		return nil
	}
	points := c.sizes.points(len(c.points))
	if max := sm.MaxPointsCount; max != nil && uint64(points) >= *max {
		return status.Errorf(codes.InvalidArgument, "Bad request: Max points count limit of %d reached!", *max)
	}
	return nil
}

// sizeStatsCache is Qdrant's CollectionSizeStatsCache, which the size
// limits of strict mode read: it holds the collection's size as at its
// creation, and takes it again at every 32nd check (the checks are
// numbered from 1 at creation). A collection created empty with
// max_points_count 2 thus takes 31 single-point upserts before the 32nd
// is refused.
type sizeStatsCache struct {
	checks     uint64
	pointCount int
}

// sizeStatsInterval is UPDATE_INTERVAL of Qdrant's cache.
const sizeStatsInterval = 32

func newSizeStatsCache() sizeStatsCache { return sizeStatsCache{checks: 1} }

// points counts one check and returns the cached point count, taking
// actual first when the check is due to refresh it.
func (s *sizeStatsCache) points(actual int) int {
	if s.checks%sizeStatsInterval == 0 {
		s.pointCount = actual
	}
	s.checks++
	return s.pointCount
}

// checkStrictFilter is check_filter: the condition limit first, then an
// index of a suitable type for every key the filter reads, when unindexed
// filtering is refused.
func (c *collection) checkStrictFilter(f *qdrant.Filter, allowUnindexed *bool) error {
	if f == nil {
		return nil
	}
	sm := c.strict
	if max := sm.FilterMaxConditions; max != nil {
		if n := conditionCount(f); n > *max {
			return strictError(fmt.Sprintf("Filter condition limit reached (%d > %d)", n, *max),
				"Reduce the amount of conditions of your filter.")
		}
	}
	if allowUnindexed != nil && !*allowUnindexed {
		if key, types, ok := c.unindexedKey(f); ok {
			return strictError(fmt.Sprintf("Index required but not found for %q of one of the following types: [%s]", key, strings.Join(types, ", ")),
				"Create an index for this key or use a different filter.")
		}
	}
	return nil
}

// conditionCount counts the conditions of f as Qdrant does: a nested
// filter counts as the conditions it holds, not as one more, so
// should[must[a, b], must[c]] is 3 and a nested empty filter 0.
func conditionCount(f *qdrant.Filter) uint64 {
	var n uint64
	for _, group := range [][]*qdrant.Condition{f.GetMust(), f.GetShould(), f.GetMustNot(), f.GetMinShould().GetConditions()} {
		for _, cond := range group {
			if nested := cond.GetFilter(); nested != nil {
				n += conditionCount(nested)
			} else {
				n++
			}
		}
	}
	return n
}

// anyIndex is every index type, which is_empty and is_null accept: as
// Qdrant lists them in its refusal.
var anyIndex = []string{"bool", "datetime", "float", "geo", "integer", "keyword", "text", "text (with phrase_matching: true)", "uuid"}

// indexNames names the index types as Qdrant's refusals do.
var indexNames = map[qdrant.PayloadSchemaType]string{
	qdrant.PayloadSchemaType_Keyword:  "keyword",
	qdrant.PayloadSchemaType_Integer:  "integer",
	qdrant.PayloadSchemaType_Float:    "float",
	qdrant.PayloadSchemaType_Geo:      "geo",
	qdrant.PayloadSchemaType_Text:     "text",
	qdrant.PayloadSchemaType_Bool:     "bool",
	qdrant.PayloadSchemaType_Datetime: "datetime",
	qdrant.PayloadSchemaType_Uuid:     "uuid",
}

// indexTypes is the key a condition reads and the index types that serve
// it: a keyword match needs a keyword index, an integer match an integer
// one, a range a float or integer one, is_empty and is_null any. has_id
// reads no key.
func indexTypes(cond *qdrant.Condition) (string, []string) {
	switch v := cond.GetConditionOneOf().(type) {
	case *qdrant.Condition_Field:
		if v.Field.Range != nil {
			return v.Field.GetKey(), []string{"float", "integer"}
		}
		switch v.Field.GetMatch().GetMatchValue().(type) {
		case *qdrant.Match_Integer, *qdrant.Match_Integers:
			return v.Field.GetKey(), []string{"integer"}
		case *qdrant.Match_Boolean:
			return v.Field.GetKey(), []string{"bool"}
		}
		return v.Field.GetKey(), []string{"keyword"}
	case *qdrant.Condition_IsEmpty:
		return v.IsEmpty.GetKey(), anyIndex
	case *qdrant.Condition_IsNull:
		return v.IsNull.GetKey(), anyIndex
	}
	return "", nil
}

// unindexedKey finds a payload key of f without an index its condition
// can use, and the types that would serve.
func (c *collection) unindexedKey(f *qdrant.Filter) (string, []string, bool) {
	for _, group := range [][]*qdrant.Condition{f.GetMust(), f.GetShould(), f.GetMustNot(), f.GetMinShould().GetConditions()} {
		for _, cond := range group {
			if nested := cond.GetFilter(); nested != nil {
				if k, types, ok := c.unindexedKey(nested); ok {
					return k, types, true
				}
				continue
			}
			key, types := indexTypes(cond)
			if key == "" {
				continue
			}
			typ, ok := c.indexes[key]
			if !ok || !slices.Contains(types, indexNames[typ]) {
				return key, types, true
			}
		}
	}
	return "", nil, false
}
