package qdranttest

import (
	"fmt"

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
// others are stored and reported only.

// strictMode is the collection's config when strict mode is enabled, nil
// otherwise.
func (c *collection) strictMode() *qdrant.StrictModeConfig {
	if c.strict.GetEnabled() {
		return c.strict
	}
	return nil
}

func strictError(description, help string) error {
	return status.Errorf(codes.InvalidArgument, "Bad request: %s Help: %s", description, help)
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
// verification/update.rs, which counts from cached estimates; the server
// counts exactly).
func (c *collection) checkStrictUpsert(n int) error {
	sm := c.strictMode()
	if sm == nil {
		return nil
	}
	if err := checkLimit(uint64(n), sm.UpsertMaxBatchsize, "upsert limit"); err != nil {
		return err
	}
	if max := sm.MaxPointsCount; max != nil && uint64(len(c.points)) >= *max {
		return status.Errorf(codes.InvalidArgument, "Bad request: Max points count limit of %d reached!", *max)
	}
	return nil
}

// checkStrictFilter is check_filter: the condition limit first, then the
// index of every key the filter reads when unindexed filtering is refused.
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
		if key, ok := c.unindexedKey(f); ok {
			return strictError(fmt.Sprintf("Index required but not found for %q", key),
				"Create an index for this key or use a different filter.")
		}
	}
	return nil
}

// conditionCount counts every condition of f, a nested filter as one
// condition plus its own.
func conditionCount(f *qdrant.Filter) uint64 {
	var n uint64
	for _, group := range [][]*qdrant.Condition{f.GetMust(), f.GetShould(), f.GetMustNot(), f.GetMinShould().GetConditions()} {
		for _, cond := range group {
			n++
			if nested := cond.GetFilter(); nested != nil {
				n += conditionCount(nested)
			}
		}
	}
	return n
}

// unindexedKey finds a payload key of f that has no index.
func (c *collection) unindexedKey(f *qdrant.Filter) (string, bool) {
	for _, group := range [][]*qdrant.Condition{f.GetMust(), f.GetShould(), f.GetMustNot(), f.GetMinShould().GetConditions()} {
		for _, cond := range group {
			var key string
			switch v := cond.GetConditionOneOf().(type) {
			case *qdrant.Condition_Field:
				key = v.Field.GetKey()
			case *qdrant.Condition_IsEmpty:
				key = v.IsEmpty.GetKey()
			case *qdrant.Condition_IsNull:
				key = v.IsNull.GetKey()
			case *qdrant.Condition_Filter:
				if k, ok := c.unindexedKey(v.Filter); ok {
					return k, true
				}
			}
			if _, ok := c.indexes[key]; key != "" && !ok {
				return key, true
			}
		}
	}
	return "", false
}
