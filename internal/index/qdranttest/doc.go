// Package qdranttest runs an in-process Qdrant gRPC server for tests.
//
// The server speaks Qdrant's own wire protocol (the generated service
// interfaces of github.com/qdrant/go-client), so code under test talks to it
// through the official client exactly as it talks to a real Qdrant: only
// the address differs. It listens on 127.0.0.1 only and keeps everything in
// memory behind one lock.
//
// It follows Qdrant 1.16.3, the version of the project's real test
// server ([Version]), and is held to it: the tests of this package and of
// internal/index/qdrant that check what Qdrant itself defines run against
// both, where testenv provides a real Qdrant. Of newer versions it models,
// only when told to claim one ([WithVersion]), an upsert's update_mode
// and a collection's optimizers_config.prevent_unoptimized (1.17), which
// 1.16.3 does not know and ignores; the version it reports lets a test
// show how a client meets an older or newer server.
//
// It models the part of Qdrant that converge's index uses, with Qdrant's
// semantics, status codes and messages:
//
//   - collections with one unnamed dense vector (Cosine, Dot, Euclid or
//     Manhattan), payload indexes, and aliases that every collection-scoped
//     call resolves; the actions of one UpdateAliases call are applied in
//     order under one lock, so readers never see half of them (and, as in
//     Qdrant, an action that fails leaves the earlier ones applied);
//   - points with UUID or integer ids: upsert (with update_filter), get,
//     delete by ids or filter, exact count, scroll in id order with paging
//     (integer ids before UUIDs), and nearest-neighbour query or search
//     computed exactly, a score threshold excluding the scores equal to it
//     (cosine vectors are normalised on write, as Qdrant stores them, and
//     returned in the flat form 1.16.3 sends); get and query return no
//     payload unless asked, scroll does;
//   - filters with must, should, must_not and min_should, nested filters,
//     match on keyword, integer, boolean, any-of keywords and any-of
//     integers, range, has_id, is_empty and is_null; a range on a field
//     with an integer payload index is decided by the index, as in Qdrant:
//     its bounds are cast to integers, so "lt 2.5" excludes 2, and
//     integers compare exactly above 2^53 (without the index, a range
//     compares floats);
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
// CollectionExists is true for an alias name too, as in Qdrant.
//
// A batch upsert with a wrong-size vector fails only as that point is
// applied, after an arbitrary part of the batch is written, as in 1.16.3:
// Qdrant applies a batch in chunks of 32 in the order of a hash map seeded
// for each request, and the server draws such an order (see Upsert), so a
// test sees a different part from one run to the next and can rely only on
// what any order gives. (From 1.18.1 Qdrant checks the whole batch first
// and writes nothing; the server does not model that.) Without wait, such a
// failure is not reported: the answer is Acknowledged, as in Qdrant.
//
// Strict mode is enforced as Qdrant 1.16.3 enforces it (see strict.go),
// with its cache of the collection's size that makes max_points_count
// refuse upserts only at the cache's next refresh. From 1.17,
// optimizers_config.prevent_unoptimized is stored and reported, though
// the deferral of points it causes in Qdrant is not modelled.
//
// Anything it does not model (named or sparse vectors,
// geo, text or datetime conditions, prefetch, order_by, shard keys, ...)
// is rejected with codes.InvalidArgument or codes.Unimplemented rather than
// answered approximately, so a test can never pass against a behaviour
// the fake only imagines. Where it answers otherwise than Qdrant, it says
// so: Count is exact even when asked for an estimate, which Qdrant gives
// from its payload indexes (and may get wrong).
//
// Where Qdrant leaves an order unspecified (equal scores), the server
// orders by descending point id: deterministic, and the opposite of the
// ascending tie-break the index promises, so a client that forgets its own
// tie-break fails its tests.
package qdranttest
