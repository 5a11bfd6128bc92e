package qdrant

import (
	"context"
	"fmt"
	"math"
	"sync/atomic"

	qd "github.com/qdrant/go-client/qdrant"
	"golang.org/x/sync/errgroup"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	"github.com/converge-sync/converge/internal/index"
)

// Payload fields and the values of "type".
const (
	fieldType        = "type"
	fieldKey         = "key"
	fieldVersion     = "version"
	fieldVersionHigh = "version_high"
	fieldVersionLow  = "version_low"
	fieldOrdinal     = "ordinal"
	fieldContentHash = "content_hash"
	fieldChunkHash   = "chunk_hash"
	fieldTitle       = "title"
	fieldTags        = "tags"
	fieldText        = "text"
	fieldDeleted     = "deleted"

	typeChunk  = "chunk"
	typeMarker = "marker"
)

// payloadIndexes are the indexes Ensure creates: every field a filter of
// the backend selects on is indexed, as a collection in Qdrant's strict
// mode requires of filtered reads and updates.
var payloadIndexes = []struct {
	field  string
	kind   qd.FieldType
	schema qd.PayloadSchemaType
}{
	{fieldKey, qd.FieldType_FieldTypeKeyword, qd.PayloadSchemaType_Keyword},
	{fieldVersion, qd.FieldType_FieldTypeInteger, qd.PayloadSchemaType_Integer},
	{fieldType, qd.FieldType_FieldTypeKeyword, qd.PayloadSchemaType_Keyword},
	{fieldVersionHigh, qd.FieldType_FieldTypeInteger, qd.PayloadSchemaType_Integer},
	{fieldVersionLow, qd.FieldType_FieldTypeInteger, qd.PayloadSchemaType_Integer},
}

const (
	// maxVectorSize is Qdrant's limit on a dense vector's dimension.
	maxVectorSize = 65536
	// maxMessageBytes bounds a response (a scroll page with vectors).
	maxMessageBytes = 64 << 20
	// pageSize is the number of points per scroll page and per lookup.
	pageSize = 256
	// minServerMajor.minServerMinor is the oldest Qdrant with conditional
	// upserts.
	minServerMajor, minServerMinor = 1, 16
)

// Backend is an [index.Backend] on one Qdrant collection. It is safe for
// concurrent use.
type Backend struct {
	cfg    Config
	client *qd.Client
	dim    atomic.Int64 // the collection's vector size once known
	// queryLimit is the collection's strict-mode max_query_limit once
	// known (noQueryLimit without one), 0 before.
	queryLimit atomic.Uint64
}

// noQueryLimit is queryLimit for a collection without max_query_limit.
const noQueryLimit = math.MaxUint64

var _ index.Backend = (*Backend)(nil)

// New connects to Qdrant and checks that the server is recent enough for
// conditional upserts. It does not touch the collection: call
// [Backend.Ensure] before anything else.
func New(ctx context.Context, cfg Config) (*Backend, error) {
	cfg.setDefaults()
	if err := cfg.Validate(); err != nil {
		return nil, err
	}
	host, port, tls, _ := parseAddr(cfg.Addr)
	client, err := qd.NewClient(&qd.Config{
		Host:      host,
		Port:      port,
		APIKey:    cfg.APIKey,
		UseTLS:    cfg.UseTLS || tls || cfg.TLS != nil,
		TLSConfig: cfg.TLS,
		// The version check below replaces the client's, which only logs.
		SkipCompatibilityCheck: true,
		PoolSize:               uint(cfg.Parallel),
		GrpcOptions: []grpc.DialOption{
			grpc.WithDefaultCallOptions(grpc.MaxCallRecvMsgSize(maxMessageBytes)),
		},
	})
	if err != nil {
		return nil, fmt.Errorf("qdrant: connect to %s: %w", cfg.Addr, err)
	}
	b := &Backend{cfg: cfg, client: client}
	if err := b.checkServer(ctx); err != nil {
		_ = client.Close()
		return nil, err
	}
	return b, nil
}

// checkServer asks the server's version: an older server would silently
// ignore update_filter and let an old marker overwrite a newer one.
func (b *Backend) checkServer(ctx context.Context) error {
	ctx, cancel := context.WithTimeout(ctx, b.cfg.Timeout)
	defer cancel()
	reply, err := b.client.GetQdrantClient().HealthCheck(ctx, &qd.HealthCheckRequest{})
	if err != nil {
		return fmt.Errorf("qdrant: health check of %s: %w", b.cfg.Addr, err)
	}
	v, err := qd.ParseVersion(reply.GetVersion())
	if err != nil {
		return fmt.Errorf("qdrant: server at %s reports version %q: %w", b.cfg.Addr, reply.GetVersion(), err)
	}
	if v.Major != minServerMajor || v.Minor < minServerMinor {
		return fmt.Errorf("qdrant: server at %s is version %s; converge needs 1.x with x >= %d (conditional upserts)",
			b.cfg.Addr, reply.GetVersion(), minServerMinor)
	}
	return nil
}

// Collection is the configured collection or alias name.
func (b *Backend) Collection() string { return b.cfg.Collection }

// Close closes the connections.
func (b *Backend) Close() error { return b.client.Close() }

// Ensure creates the collection (cosine distance, vectors of dim) if it is
// missing, and the payload indexes that are missing: key and type
// (keyword), version, version_high and version_low (integer). An existing
// collection of another dimension or distance is an error; a collection
// created concurrently by another process is fine.
//
// Of an existing collection it checks the vectors and the settings first
// (see checkSettings), and then that the API key may write, failing with a
// [*WriteDeniedError] if not: on a collection already set up, Ensure
// itself only reads, and a read-only key would pass it and then fail every
// write the projector makes. The settings come first because the write
// check is a write that waits, which a collection that defers unoptimized
// points may not answer for a long time. A key that may not create a
// missing collection, or its payload indexes, is a [*WriteDeniedError] too.
func (b *Backend) Ensure(ctx context.Context, dim int) error {
	if dim < 1 || dim > maxVectorSize {
		return fmt.Errorf("qdrant: vector dimension %d is outside 1..%d", dim, maxVectorSize)
	}
	info, err := b.info(ctx)
	created := false
	if status.Code(err) == codes.NotFound {
		switch err = b.create(ctx, dim); {
		case err == nil:
			created = true
		case status.Code(err) == codes.PermissionDenied:
			return &WriteDeniedError{Collection: b.cfg.Collection, Err: err}
		default:
			// Another process may have created it in between: check what
			// it created.
			var ierr error
			if info, ierr = b.info(ctx); ierr != nil {
				return b.fail("create collection", err)
			}
			err = nil
		}
	}
	if err != nil {
		return b.fail("get collection", err)
	}
	if !created {
		if err := b.checkVectors(info, dim); err != nil {
			return err
		}
		if err := b.checkSettings(info); err != nil {
			return err
		}
		if err := b.checkWrite(ctx); err != nil {
			return err
		}
	}
	for _, ix := range payloadIndexes {
		if info.GetPayloadSchema()[ix.field].GetDataType() == ix.schema {
			continue
		}
		if err := b.call(ctx, func(ctx context.Context) error {
			_, err := b.client.GetPointsClient().CreateFieldIndex(ctx, &qd.CreateFieldIndexCollection{
				CollectionName: b.cfg.Collection,
				Wait:           qd.PtrOf(true),
				FieldName:      ix.field,
				FieldType:      qd.PtrOf(ix.kind),
			})
			return err
		}); err != nil {
			if status.Code(err) == codes.PermissionDenied {
				return &WriteDeniedError{Collection: b.cfg.Collection, Err: err}
			}
			return b.fail("create payload index on "+ix.field, err)
		}
	}
	if created {
		// Read back what the server made of the collection: a server may
		// apply its own defaults (strict mode) to one created here. An
		// existing one's settings were checked above, and payload
		// indexes do not change them.
		if info, err = b.info(ctx); err != nil {
			return b.fail("get collection", err)
		}
		if err := b.checkSettings(info); err != nil {
			return err
		}
	}
	b.dim.Store(int64(dim))
	b.queryLimit.Store(queryLimitOf(info))
	return nil
}

// writeCheckID is the point the write check deletes: the nil UUID, which
// no point of converge has (chunk and marker ids are name-based SHA-1
// UUIDs, whose version bits are never zero).
const writeCheckID = "00000000-0000-0000-0000-000000000000"

// checkWrite deletes writeCheckID, which changes nothing: Qdrant
// authorises a delete of points by id exactly as it does an upsert (both
// are point operations needing write access, lib/storage/src/rbac/
// ops_checks.rs). It looks the collection up first (the strict-mode check
// of do_delete_points, src/common/update.rs, needs only read access) and
// checks write access next (TableOfContent::update, lib/storage/src/
// content_manager/toc/point_ops.rs). So on an existing collection
// PermissionDenied means the key may not write, while FailedPrecondition
// (writes locked) comes after the access check and means it may. NotFound
// says nothing about the key: the collection was dropped since Ensure read
// it, which the requests that follow report.
func (b *Backend) checkWrite(ctx context.Context) error {
	err := b.call(ctx, func(ctx context.Context) error {
		_, err := b.client.GetPointsClient().Delete(ctx, &qd.DeletePoints{
			CollectionName: b.cfg.Collection,
			Wait:           qd.PtrOf(true),
			Points:         qd.NewPointsSelector(qd.NewID(writeCheckID)),
		})
		return err
	})
	switch status.Code(err) {
	case codes.OK, codes.NotFound, codes.FailedPrecondition:
		return nil
	case codes.PermissionDenied:
		return &WriteDeniedError{Collection: b.cfg.Collection, Err: err}
	}
	return b.fail("check write access", err)
}

func (b *Backend) info(ctx context.Context) (*qd.CollectionInfo, error) {
	var info *qd.CollectionInfo
	err := b.call(ctx, func(ctx context.Context) error {
		resp, err := b.client.GetCollectionsClient().Get(ctx, &qd.GetCollectionInfoRequest{CollectionName: b.cfg.Collection})
		info = resp.GetResult()
		return err
	})
	return info, err
}

func (b *Backend) create(ctx context.Context, dim int) error {
	return b.call(ctx, func(ctx context.Context) error {
		cc := &qd.CreateCollection{
			CollectionName: b.cfg.Collection,
			VectorsConfig: qd.NewVectorsConfig(&qd.VectorParams{
				Size:     uint64(dim),
				Distance: qd.Distance_Cosine,
			}),
		}
		if n := b.cfg.Shards; n > 0 {
			cc.ShardNumber = qd.PtrOf(uint32(n))
		}
		if n := b.cfg.Replication; n > 0 {
			cc.ReplicationFactor = qd.PtrOf(uint32(n))
		}
		if n := b.cfg.WriteConsistency; n > 0 {
			cc.WriteConsistencyFactor = qd.PtrOf(uint32(n))
		}
		_, err := b.client.GetCollectionsClient().Create(ctx, cc)
		return err
	})
}

func (b *Backend) checkVectors(info *qd.CollectionInfo, dim int) error {
	params := info.GetConfig().GetParams().GetVectorsConfig().GetParams()
	if params == nil {
		return fmt.Errorf("qdrant: collection %q has no single unnamed vector (named vectors are not used by converge)", b.cfg.Collection)
	}
	if params.GetDistance() != qd.Distance_Cosine {
		return fmt.Errorf("qdrant: collection %q uses %v distance, not Cosine", b.cfg.Collection, params.GetDistance())
	}
	if int(params.GetSize()) != dim {
		return &DimensionError{Collection: b.cfg.Collection, Have: int(params.GetSize()), Want: dim}
	}
	return nil
}

// vectorSize is the collection's dimension, from Ensure or asked once.
func (b *Backend) vectorSize(ctx context.Context) (int, error) {
	if d := b.dim.Load(); d > 0 {
		return int(d), nil
	}
	info, err := b.info(ctx)
	if err != nil {
		return 0, b.fail("get collection", err)
	}
	size := int(info.GetConfig().GetParams().GetVectorsConfig().GetParams().GetSize())
	if size < 1 {
		return 0, fmt.Errorf("qdrant: collection %q has no single unnamed vector", b.cfg.Collection)
	}
	b.dim.Store(int64(size))
	return size, nil
}

// SwitchAlias points alias at collection in one request (delete, then
// create), which Qdrant applies under one lock: readers of the alias see
// the old collection or the new one, never neither. A missing alias is
// simply created.
//
// Qdrant does not roll back the delete when the create fails, so the
// target is checked first: switching to a missing collection fails with
// [ErrCollectionNotFound], and switching to an alias (which Qdrant refuses
// as a target) fails too, both leaving the alias alone.
func (b *Backend) SwitchAlias(ctx context.Context, alias, collection string) error {
	if err := validName(alias); err != nil {
		return fmt.Errorf("qdrant: alias: %w", err)
	}
	target, err := b.AliasTarget(ctx, collection)
	if err != nil {
		return err
	}
	if target != "" {
		return fmt.Errorf("qdrant: switch alias %s: %q is an alias (of %q), not a collection", alias, collection, target)
	}
	// Not an alias, so Qdrant's answer is about a collection.
	exists, err := b.nameExists(ctx, collection)
	if err != nil {
		return err
	}
	if !exists {
		return &Error{Op: "switch alias " + alias, Collection: collection,
			Err: status.Errorf(codes.NotFound, "collection %q does not exist", collection)}
	}
	err = b.call(ctx, func(ctx context.Context) error {
		_, err := b.client.GetCollectionsClient().UpdateAliases(ctx, &qd.ChangeAliases{
			Actions: []*qd.AliasOperations{
				qd.NewAliasDelete(alias),
				qd.NewAliasCreate(alias, collection),
			},
		})
		return err
	})
	if err != nil {
		return &Error{Op: "switch alias " + alias, Collection: collection, Err: err}
	}
	if alias == b.cfg.Collection {
		// The alias may now name a collection of another dimension
		// and other settings.
		b.dim.Store(0)
		b.queryLimit.Store(0)
	}
	return nil
}

// DropCollection deletes a collection, such as the one a rebuild has
// switched an alias away from. It refuses to drop a collection that an
// alias still names, since Qdrant would drop the alias with it. A
// collection that does not exist is already dropped, and so is one whose
// name is now an alias (a legacy collection replaced by the alias to its
// successor): Qdrant drops collections by name only, never through an
// alias, so nothing is sent.
func (b *Backend) DropCollection(ctx context.Context, collection string) error {
	target, err := b.AliasTarget(ctx, collection)
	if err != nil {
		return err
	}
	if target != "" {
		return nil
	}
	var aliases []*qd.AliasDescription
	err = b.call(ctx, func(ctx context.Context) error {
		resp, err := b.client.GetCollectionsClient().ListCollectionAliases(ctx, &qd.ListCollectionAliasesRequest{CollectionName: collection})
		aliases = resp.GetAliases()
		return err
	})
	// Qdrant lists a missing collection's aliases as none (do_list_collection_aliases
	// in src/common/collections.rs), so a missing collection goes on to
	// Delete, which answers that nothing was deleted.
	switch {
	case err != nil:
		return &Error{Op: "list aliases", Collection: collection, Err: err}
	case len(aliases) > 0:
		return fmt.Errorf("qdrant: collection %q is still named by alias %q: switch the alias first", collection, aliases[0].GetAliasName())
	}
	err = b.call(ctx, func(ctx context.Context) error {
		_, err := b.client.GetCollectionsClient().Delete(ctx, &qd.DeleteCollection{CollectionName: collection})
		return err
	})
	if err != nil {
		return &Error{Op: "drop collection", Collection: collection, Err: err}
	}
	if collection == b.cfg.Collection {
		b.dim.Store(0)
		b.queryLimit.Store(0)
	}
	return nil
}

// call runs one request under the configured timeout.
func (b *Backend) call(ctx context.Context, fn func(ctx context.Context) error) error {
	ctx, cancel := context.WithTimeout(ctx, b.cfg.Timeout)
	defer cancel()
	return fn(ctx)
}

func (b *Backend) fail(op string, err error) error {
	return &Error{Op: op, Collection: b.cfg.Collection, Err: err}
}

// inBatches calls fn on consecutive ranges [lo, hi) of at most size of n
// items, with at most Parallel calls in flight. The first error cancels
// the calls not yet started and is returned.
func (b *Backend) inBatches(ctx context.Context, n, size int, fn func(ctx context.Context, lo, hi int) error) error {
	g, gctx := errgroup.WithContext(ctx)
	g.SetLimit(b.cfg.Parallel)
	for lo := 0; lo < n && gctx.Err() == nil; lo += size {
		hi := min(lo+size, n)
		g.Go(func() error { return fn(gctx, lo, hi) })
	}
	if err := g.Wait(); err != nil {
		return err
	}
	return ctx.Err()
}
