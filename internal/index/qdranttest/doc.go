// Package qdranttest runs an in-process Qdrant gRPC server for tests.
//
// The server speaks Qdrant's own wire protocol (the generated service
// interfaces of github.com/qdrant/go-client), so code under test talks to it
// through the official client exactly as it talks to a real Qdrant: only
// the address differs. It listens on 127.0.0.1 only and keeps everything in
// memory behind one lock.
//
// It models the part of Qdrant that converge's index uses, with Qdrant's
// semantics and status codes:
//
//   - collections with one unnamed dense vector (Cosine, Dot, Euclid or
//     Manhattan), payload indexes, and aliases that every collection-scoped
//     call resolves; the actions of one UpdateAliases call are applied in
//     order under one lock, so readers never see half of them (and, as in
//     Qdrant, an action that fails leaves the earlier ones applied);
//   - points with UUID or integer ids: upsert (with update_filter and
//     update_mode), get, delete by ids or filter, exact count, scroll in id
//     order with paging, and nearest-neighbour query or search computed
//     exactly (cosine vectors are normalised on write, as Qdrant stores
//     them);
//   - filters with must, should, must_not and min_should, nested filters,
//     match on keyword, integer, boolean, any-of keywords and any-of
//     integers, range, has_id, is_empty and is_null;
//   - the api-key (or "authorization: Bearer") metadata when the server has
//     a key; HealthCheck is exempt, as in Qdrant, and reports version
//     [Version]. A read-only key ([WithReadOnlyAPIKey]) may make every
//     read, and every write made with it is codes.PermissionDenied, as
//     Qdrant refuses its read-only key (but a point write or a payload
//     index on a missing collection is codes.NotFound, as Qdrant looks
//     the collection up before it checks write access for those);
//     [Server.SetAPIKeys] changes the keys under running clients.
//
// It is strict where Qdrant is: a missing collection is codes.NotFound, a
// wrong vector size, a malformed id or a malformed request is
// codes.InvalidArgument. Creating a collection (or an alias) under the name
// of an existing collection is codes.AlreadyExists ("Wrong input: Collection
// `x` already exists!"), which is what Qdrant answers since 1.8.0 (before,
// InvalidArgument; the change is qdrant/qdrant pull request 3423).
// CollectionExists is true for an alias name too, as in Qdrant. A batch
// upsert with a wrong-size vector is refused only as that point is applied,
// after the points before it are written (see Upsert), as in Qdrant.
//
// Strict mode is enforced as Qdrant enforces it (see strict.go), and
// optimizers_config.prevent_unoptimized is stored and reported, though
// the deferral of points it causes in Qdrant is not modelled.
//
// Anything it does not model (named or sparse vectors,
// geo, text or datetime conditions, prefetch, order_by, shard keys, ...)
// is rejected with codes.InvalidArgument or codes.Unimplemented rather than
// answered approximately, so a test can never pass against a behaviour
// the fake only imagines.
//
// Where Qdrant leaves an order unspecified (equal scores), the server
// orders by descending point id: deterministic, and the opposite of the
// ascending tie-break the index promises, so a client that forgets its own
// tie-break fails its tests.
package qdranttest
