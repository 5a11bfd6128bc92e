package qdrant

import (
	"fmt"

	qd "github.com/qdrant/go-client/qdrant"

	"github.com/converge-sync/converge/internal/index"
)

// Default values of [Config], exported for the index projector's flags
// (-qdrant-collection, -qdrant-batch, -qdrant-parallel), which take them
// too, and for its Stores (the Timeout). Each is written once, in
// config.go, whose setDefaults gives them to a zero Config.
const (
	DefaultCollection = defaultCollection
	DefaultBatchSize  = defaultBatchSize
	DefaultParallel   = defaultParallel
	DefaultTimeout    = defaultTimeout
)

// checkSettings refuses, at start, a collection whose settings the backend
// cannot work under, naming the setting, instead of failing each event.
//
// Strict mode (on by default for new collections on Qdrant Cloud) refuses
// requests over its limits with InvalidArgument, which the projector would
// take for a bad event and dead-letter (StrictModeVerification in
// lib/collection/src/operations/verification/mod.rs). Its capacity limits
// (max_points_count, max_collection_vector_size_bytes,
// max_collection_payload_size_bytes) are accepted: once one is reached,
// every upsert is refused and retried, with an error naming the setting. Unindexed filters
// are no concern: Ensure indexes every field the backend filters on.
//
// prevent_unoptimized defers points until their segment is optimized: a
// write that waits, as all of the backend's do, is not answered until then
// (UpdateWorkers::update_worker_fn in lib/collection/src/update_workers/
// update_worker.rs), and count, scroll and retrieve skip the points not
// yet optimized (tests/openapi/test_deferred_points.py in Qdrant), so a
// count fence or a marker read right after a write would be wrong.
func (b *Backend) checkSettings(info *qd.CollectionInfo) error {
	cfg := info.GetConfig()
	if cfg.GetOptimizerConfig().GetPreventUnoptimized() {
		return fmt.Errorf("qdrant: collection %q sets optimizers_config.prevent_unoptimized: writes are then not answered until their points are optimized, and counts and scrolls skip points not yet optimized, so converge's writes stall and its count fences and version markers would be wrong; turn it off for this collection", b.cfg.Collection)
	}
	sm := cfg.GetStrictModeConfig()
	if !sm.GetEnabled() {
		return nil
	}
	refuse := func(setting, why string) error {
		return fmt.Errorf("qdrant: collection %q in strict mode: strict_mode_config.%s %s", b.cfg.Collection, setting, why)
	}
	if sm.SearchAllowExact != nil && !sm.GetSearchAllowExact() {
		return refuse("search_allow_exact", "is false: converge's count fences need exact counts; allow exact search")
	}
	// Scroll pages need pageSize; Search keeps its requests within the
	// limit, whatever k (see Search).
	if sm.MaxQueryLimit != nil && sm.GetMaxQueryLimit() < pageSize {
		return refuse("max_query_limit", fmt.Sprintf("is %d: converge reads pages of %d points; raise it to at least %d", sm.GetMaxQueryLimit(), pageSize, pageSize))
	}
	if sm.UpsertMaxBatchsize != nil && sm.GetUpsertMaxBatchsize() < uint64(b.cfg.BatchSize) {
		return refuse("upsert_max_batchsize", fmt.Sprintf("is %d, below the batch size %d: lower the batch size (CONVERGE_QDRANT_BATCH) to it", sm.GetUpsertMaxBatchsize(), b.cfg.BatchSize))
	}
	// The capacity limits are a state of the collection: writes refused
	// once one is reached are retried, not dead-lettered (see
	// [Error.Permanent]). Only the point count is reported, so only a
	// collection already at max_points_count is refused here.
	if sm.MaxPointsCount != nil && info.GetPointsCount() >= sm.GetMaxPointsCount() {
		return refuse("max_points_count", fmt.Sprintf("is %d and the collection holds %d points: every upsert would be refused; raise it", sm.GetMaxPointsCount(), info.GetPointsCount()))
	}
	if sm.FilterMaxConditions != nil && sm.GetFilterMaxConditions() < deleteConditions(b.cfg.BatchSize) {
		return refuse("filter_max_conditions", fmt.Sprintf("is %d: a delete of stale chunks for %d documents has up to %d conditions; raise it or lower the batch size", sm.GetFilterMaxConditions(), b.cfg.BatchSize, deleteConditions(b.cfg.BatchSize)))
	}
	return nil
}

// deleteConditions bounds the conditions of one DeleteStale request of n
// keeps: per keep one should clause, a nested filter holding key, type and
// the older-version conditions (staleChunks).
func deleteConditions(n int) uint64 {
	return uint64(n) * conditionCount(staleChunks(index.Keep{Key: "k", Version: 1})) //nolint:gosec // n > 0
}

// conditionCount counts the conditions of f as strict mode's
// filter_max_conditions does on Qdrant 1.16: only the leaves, a nested
// filter adding nothing itself.
func conditionCount(f *qd.Filter) uint64 {
	var n uint64
	for _, group := range [][]*qd.Condition{f.GetMust(), f.GetShould(), f.GetMustNot(), f.GetMinShould().GetConditions()} {
		for _, c := range group {
			if nested := c.GetFilter(); nested != nil {
				n += conditionCount(nested)
				continue
			}
			n++
		}
	}
	return n
}
