// Package writer is converge's only writer of Postgres: the HTTP API and the
// JetStream ingest consumer through which producers write documents. Both
// paths validate input, then store it with [docstore.Store], which writes the
// document, its chunks and its outbox event in one statement (see the
// docstore package for the write order).
//
// Bad input is answered with an error naming the problem and never touches
// what was already accepted. On the ingest path a message is acknowledged
// only after its Postgres commit; a message that can never apply (malformed,
// or a version conflict) is published to the dead-letter subject
// converge.dlq.ingest with the reason in headers, and only then acknowledged,
// so it neither blocks the stream nor vanishes.
//
// POST /v1/admin/reemit re-emits documents (see [docstore.Store.Reemit]):
// the operator's repair of a projection, used by converge backfill and
// converge verify --repair.
package writer
