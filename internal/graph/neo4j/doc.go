// Package neo4j is the [graph.Backend] on a Neo4j database, 5.3 or later
// (Community edition suffices), spoken to over Bolt with the official Go
// driver.
//
// The graph:
//
//	(:Document {key, version, title, content_hash, deleted})
//	(:Document {key, stub: true})            a link target not yet written
//	(:Chunk {id, key, version, ordinal, content_hash})
//	(:Tag {name})
//	(:Document)-[:HAS_CHUNK]->(:Chunk)
//	(:Document)-[:LINKS_TO]->(:Document)
//	(:Document)-[:TAGGED]->(:Tag)
//
// [Backend.Ensure] creates uniqueness constraints on Document.key, Chunk.id
// and Tag.name; every write is a MERGE on one of those keys, so no node is
// ever created twice. Tag nodes are shared by the documents tagged with
// them and are never deleted: a tag no document uses any more stays as an
// orphan (:Tag) node, which reads ignore.
//
// # Schema
//
// Creating a uniqueness constraint is not one step on the server: Neo4j 5
// creates its backing index (named like the constraint) in a transaction
// of its own, populates it, and commits the constraint with the caller's
// transaction. Until then the index shows POPULATING with no owning
// constraint; a rollback drops it. A client that dies while the statement
// runs (a SIGKILLed projector) can leave that index behind for good, with
// no transaction and no constraint (Neo4j 5.26 does after a few of every
// twenty connections cut early in the statement), and CREATE CONSTRAINT
// ... IF NOT EXISTS then fails on every attempt with
// Neo.ClientError.Schema.IndexWithNameAlreadyExists.
//
// So Ensure does not only send CREATE CONSTRAINT: for each constraint it
// reads the index of its name (SHOW INDEXES) and takes the step that state
// calls for, each in a schema transaction of its own, then reads it again,
// until the constraint is there with its index ONLINE:
//
//	no index                          create the constraint
//	the constraint's, ONLINE          done
//	the constraint's, POPULATING      wait for it (db.awaitIndex), up to Config.SchemaWait
//	the constraint's, FAILED          drop the constraint, then create it again
//	an index of the name, no owner    drop it, then create the constraint
//	owned by another constraint       fail: it is not converge's
//
// Dropping an index without its owner is safe even while another
// instance's creation of that constraint runs: the creation holds a schema
// lock that DROP INDEX waits for, and once it has committed, Neo4j refuses
// to drop a constraint's index. A step that fails because another
// instance got there first is looked at again after a pause. Stopped
// between any two steps, Ensure leaves one of the states above, which the
// next Ensure carries on from. A constraint of the operator's on the
// same label and property, under another name, makes CREATE CONSTRAINT
// ... IF NOT EXISTS do nothing, and Ensure takes it for the constraint.
// Data that violates a constraint, an index of the operator's on the same
// label and property, or a missing privilege fail Ensure at once.
//
// # Writes
//
// [Backend.Apply] sorts the documents by key and writes them in batches of
// [Config.BatchSize], one managed write transaction (driver retries on
// transient errors and deadlocks included) per batch. Every statement is a
// constant that takes its values from parameters (UNWIND $rows). Within a
// transaction the statements run in this order:
//
//  0. read, without locks, the stored versions of the batch's documents
//     and their outgoing links and tags;
//  1. one statement for the rest, so that no round trip to the server
//     falls between taking the locks and the commit. It first locks (by
//     setting and removing a _LOCK_ property) every node the transaction
//     will touch, the (:Document) nodes by key, then the (:Tag) nodes by
//     name: the batch's documents, and of those that step 0 shows the
//     guard will apply, their old and new link targets (a target not yet
//     seen becomes a stub) and tags. Writing or deleting a relationship
//     locks both of its end nodes; taking every lock up front in one
//     order shared by all transactions makes concurrent batches (the
//     projector's parallel shards, whose documents link each other's and
//     share tags) wait for each other instead of deadlocking. Then the
//     freshness guard MERGEs each (:Document) by key, takes its write
//     lock before reading its version, and sets its fields only if the
//     incoming version is greater than the stored one (or the node is
//     new or a stub). Of the documents it applies, and of no other (a
//     stale version creates nothing, not even the stubs of its links),
//     it DETACH DELETEs the (:Chunk) nodes and deletes the outgoing
//     LINKS_TO and TAGGED relationships of older versions, MERGEs the new
//     chunks, the link targets (the locks have created them when step 0
//     read right, and this keeps the write whole when it did not: a
//     document written behind the backend's back between the read and
//     the guard) and the (:Tag) nodes, and creates the new HAS_CHUNK,
//     LINKS_TO and TAGGED relationships;
//  2. in the same statement, once every document is written, the count
//     fence: it answers, per key, whether the version applied and the
//     document's HAS_CHUNK, LINKS_TO and TAGGED relationships, and the
//     backend fails the transaction ([*FenceError]) unless those of each
//     applied document equal the incoming numbers.
//
// A withdrawal goes through the same steps with no chunks, links or tags:
// its node stays, deleted and with its version, as a tombstone that a late
// older version cannot get past, and relationships from other documents
// to it stay.
//
// A transaction commits whole or not at all. If Apply fails on a later
// transaction, the earlier ones stay committed; applying the same
// documents again is harmless (the committed ones report not applied,
// their version being stored already). A batch that exceeds the server's
// bound on one transaction's memory (db.memory.transaction.max) is not
// retried as it is (the same transaction would fail the same way) but
// split in halves, each written in its own transaction and split again as
// needed, so that a failure after a split may leave the first halves
// committed; a single document too large fails with [ErrTooLarge]. A
// transaction timeout is retried like any transient failure: with the
// lock order, transactions wait for each other, and a timeout says little
// about a batch's size.
//
// # Wipe
//
// [Backend.Wipe] empties the projection for a rebuild in place: the
// relationships first, then the nodes, each in transactions of a bounded
// number, so that a tag or document linked from very many documents is
// never deleted with all of its relationships in one transaction.
//
// # Errors
//
// A failure returns an [*Error] naming the operation and the database and
// keeping the driver's error as its cause. Its Permanent method, which the
// projector runtime consults before dead-lettering, is true only when
// Neo4j rejected the statement itself (Neo.ClientError.Statement.*, but
// for EntityNotFound, which a concurrent delete causes, or
// Neo.ClientError.Schema.ConstraintValidationFailed), a single document
// is too large for one transaction ([ErrTooLarge]), or Apply was given
// documents it cannot write ([ErrInvalidDocs]); a count fence mismatch,
// like an unreachable server or a transaction that kept deadlocking past
// Config.MaxRetryTime, is retried.
package neo4j
