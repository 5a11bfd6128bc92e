package neo4j

// The Cypher statements of the backend: constants, every value a
// parameter. The statements of a write transaction run in the order
// listed (see the package documentation).

// Ensure: one schema statement per transaction (see schema.go). IF NOT
// EXISTS makes each a no-op when an equivalent constraint exists; it fails
// when an index of the constraint's name exists without the constraint.
const (
	cypherConstraintDocumentKey = `CREATE CONSTRAINT converge_document_key IF NOT EXISTS
FOR (n:Document) REQUIRE n.key IS UNIQUE`
	cypherConstraintChunkID = `CREATE CONSTRAINT converge_chunk_id IF NOT EXISTS
FOR (n:Chunk) REQUIRE n.id IS UNIQUE`
	cypherConstraintTagName = `CREATE CONSTRAINT converge_tag_name IF NOT EXISTS
FOR (n:Tag) REQUIRE n.name IS UNIQUE`
)

// cypherShowIndexes reads the indexes called $names: the constraint that
// owns each (null for none), its state (ONLINE, POPULATING, FAILED) and
// how much of it is populated.
const cypherShowIndexes = `SHOW INDEXES YIELD name, owningConstraint, state, populationPercent
WHERE name IN $names
RETURN name, owningConstraint, state, populationPercent`

// cypherAwaitIndex waits up to $seconds for the index $name to come
// online, and fails if it does not, or is FAILED.
const cypherAwaitIndex = `CALL db.awaitIndex($name, $seconds)`

// cypherDropIndex drops the index $name, which no constraint owns: Neo4j
// refuses to drop a constraint's index, and waits for the schema lock of
// a constraint being created.
const cypherDropIndex = `DROP INDEX $name IF EXISTS`

// cypherDropConstraint drops the constraint $name and its index.
const cypherDropConstraint = `DROP CONSTRAINT $name IF EXISTS`

// cypherReadBatch reads, before any lock is taken, what the graph holds
// of a batch's documents: their versions (null for a stub) and the
// targets of their outgoing links and tags, which the transaction's
// writes will lock. $keys: the batch's documents, sorted. A key missing
// from the answer has no node.
const cypherReadBatch = `UNWIND $keys AS key
MATCH (d:Document {key: key})
RETURN key, d.version AS version,
       [(d)-[:LINKS_TO]->(t:Document) | t.key] AS links,
       [(d)-[:TAGGED]->(t:Tag) | t.name] AS tags`

// cypherWriteDocuments is the rest of a batch's transaction after
// cypherReadBatch, in one statement: the locks, the freshness guard, the
// writes of the documents it applies, and the count fence. $keys: the
// document nodes to lock, sorted, distinct; $names: the tag nodes to
// lock, sorted, distinct; $rows: [{key, version, deleted, title,
// content_hash, repair, chunks: [{id, ordinal, content_hash}], links,
// tags}], sorted by key; links and tags sorted, distinct.
//
// The locks: the first subquery takes the write lock of every document
// node the transaction will touch, in key order, creating those not yet
// seen as stubs; the second, then, that of every tag node, in name order,
// creating those not yet seen. A relationship written or deleted locks
// both of its end nodes, so without this, two transactions linking each
// other's documents (the projector's parallel shards do) lock them in
// opposite orders and deadlock. Each subquery runs whole before the next
// clause (the query has one row there), so every lock is taken, in this
// order, before any other write.
//
// The guard: setting _LOCK_ takes the node's write lock before its
// version is read (the lost-update pattern of the Neo4j manual), so two
// transactions writing one key cannot both see the old version; the lock
// is held to the end of the transaction. A node without a version (new,
// or a stub) takes any version; a repair row also rewrites the version
// the node holds.
//
// Of an applied row, the subquery sets the node's fields, deletes the
// chunks and outgoing LINKS_TO and TAGGED relationships of older
// versions, and creates the new ones, MERGE-ing the chunk nodes, the link
// targets (a key not yet seen becomes a stub) and the tags. The
// relationships are created, not merged: the document has none left of
// those types, and the incoming chunks, links and tags are distinct. A
// row not applied writes nothing, not even the stubs of its links.
//
// The fence: after every row is written (collect waits for all of
// them), each document's HAS_CHUNK, LINKS_TO and TAGGED relationships
// are counted; the backend compares the counts of the applied rows with
// the incoming numbers.
const cypherWriteDocuments = `CALL {
  UNWIND $keys AS key
  MERGE (d:Document {key: key})
  ON CREATE SET d.stub = true
  SET d._LOCK_ = true
  REMOVE d._LOCK_
}
CALL {
  UNWIND $names AS name
  MERGE (t:Tag {name: name})
  SET t._LOCK_ = true
  REMOVE t._LOCK_
}
UNWIND $rows AS row
MERGE (d:Document {key: row.key})
SET d._LOCK_ = true
WITH d, row, (d.version IS NULL OR d.version < row.version OR (row.repair AND d.version = row.version)) AS applied
REMOVE d._LOCK_
WITH d, row, applied
CALL {
  WITH d, row, applied
  WITH d, row
  WHERE applied
  SET d.version = row.version, d.title = row.title, d.content_hash = row.content_hash,
      d.deleted = row.deleted, d.stub = null
  WITH d, row
  CALL {
    WITH d
    MATCH (d)-[:HAS_CHUNK]->(old:Chunk)
    DETACH DELETE old
  }
  CALL {
    WITH d
    MATCH (d)-[r:LINKS_TO|TAGGED]->()
    DELETE r
  }
  CALL {
    WITH d, row
    UNWIND row.chunks AS chunk
    MERGE (c:Chunk {id: chunk.id})
    SET c.key = row.key, c.version = row.version, c.ordinal = chunk.ordinal,
        c.content_hash = chunk.content_hash
    CREATE (d)-[:HAS_CHUNK]->(c)
  }
  CALL {
    WITH d, row
    UNWIND row.links AS link
    MERGE (t:Document {key: link})
    ON CREATE SET t.stub = true
    CREATE (d)-[:LINKS_TO]->(t)
  }
  CALL {
    WITH d, row
    UNWIND row.tags AS name
    MERGE (t:Tag {name: name})
    CREATE (d)-[:TAGGED]->(t)
  }
}
WITH collect({key: row.key, applied: applied, d: d}) AS written
UNWIND written AS w
WITH w.key AS key, w.applied AS applied, w.d AS d
RETURN key, applied,
       COUNT { (d)-[:HAS_CHUNK]->(:Chunk) } AS chunks,
       COUNT { (d)-[:LINKS_TO]->(:Document) } AS links,
       COUNT { (d)-[:TAGGED]->(:Tag) } AS tags`

// cypherView returns what the graph holds about document node d, one
// record per node. Lists come back in no particular order; the backend
// sorts them.
const cypherView = `
RETURN d.key AS key, d.version AS version, d.deleted AS deleted, d.title AS title,
       d.content_hash AS content_hash, d.stub AS stub,
       [(d)-[:HAS_CHUNK]->(c:Chunk) | {id: c.id, ordinal: c.ordinal, content_hash: c.content_hash}] AS chunks,
       [(d)-[:LINKS_TO]->(t:Document) | t.key] AS links,
       [(d)-[:TAGGED]->(t:Tag) | t.name] AS tags,
       [(s:Document)-[:LINKS_TO]->(d) | s.key] AS linked_by`

// cypherDocument reads one document. $key.
const cypherDocument = `MATCH (d:Document {key: $key})` + cypherView

// cypherScanDocuments reads the next page of documents in key order, after
// the cursor $after ("" to start), at most $limit of them.
const cypherScanDocuments = `MATCH (d:Document)
WHERE d.key > $after
WITH d ORDER BY d.key LIMIT $limit` + cypherView

// cypherWipeRelationships deletes up to $limit of the projection's
// relationships, for a rebuild in place; run until it deletes fewer,
// before cypherWipe.
const cypherWipeRelationships = `MATCH ()-[r:HAS_CHUNK|LINKS_TO|TAGGED]->()
WITH r LIMIT $limit
DELETE r
RETURN count(*) AS deleted`

// cypherWipe deletes up to $limit of the projection's nodes (documents,
// chunks, tags) with their remaining relationships, for a rebuild in
// place; run until it deletes fewer. Nodes of other labels are left
// alone.
const cypherWipe = `MATCH (n)
WHERE n:Document OR n:Chunk OR n:Tag
WITH n LIMIT $limit
DETACH DELETE n
RETURN count(*) AS deleted`

// cypherWipeDocumentRelationships deletes, of the documents $keys, their
// chunks and outgoing LINKS_TO and TAGGED relationships, for a rebuild of
// their partition; run for every key before cypherWipeDocuments, so that
// none of them still links to another.
const cypherWipeDocumentRelationships = `UNWIND $keys AS key
MATCH (d:Document {key: key})
CALL {
  WITH d
  MATCH (d)-[:HAS_CHUNK]->(c:Chunk)
  DETACH DELETE c
}
CALL {
  WITH d
  MATCH (d)-[r:LINKS_TO|TAGGED]->()
  DELETE r
}
RETURN count(d) AS deleted`

// cypherWipeDocuments deletes the document nodes $keys, after
// cypherWipeDocumentRelationships; one another document still links to
// loses its fields instead and stays, a stub. Answers how many it deleted.
const cypherWipeDocuments = `UNWIND $keys AS key
MATCH (d:Document {key: key})
WITH d, EXISTS { (:Document)-[:LINKS_TO]->(d) } AS linked
CALL {
  WITH d, linked
  WITH d
  WHERE linked
  SET d.stub = true
  REMOVE d.version, d.title, d.content_hash, d.deleted
}
CALL {
  WITH d, linked
  WITH d
  WHERE NOT linked
  DETACH DELETE d
}
RETURN sum(CASE WHEN linked THEN 0 ELSE 1 END) AS deleted`

// cypherDocumentKeys reads the next page of document keys, in key order,
// after $after: a rebuild of a partition finds its documents' keys with
// it.
const cypherDocumentKeys = `MATCH (d:Document)
WHERE d.key > $after
RETURN d.key AS key
ORDER BY key
LIMIT $limit`

// cypherStrayChunks reads the chunk nodes no document node holds
// (HAS_CHUNK), their keys and ids: a chunk whose document node is gone,
// or was made again (a stub), is found by them alone. It reads every
// chunk node.
const cypherStrayChunks = `MATCH (c:Chunk)
WHERE c.key IS NOT NULL AND NOT EXISTS { (:Document)-[:HAS_CHUNK]->(c) }
RETURN c.key AS key, c.id AS id`

// cypherWipeChunks deletes the chunk nodes $ids that no document node
// holds. Answers how many it deleted.
const cypherWipeChunks = `UNWIND $ids AS id
MATCH (c:Chunk {id: id})
WHERE NOT EXISTS { (:Document)-[:HAS_CHUNK]->(c) }
DETACH DELETE c
RETURN count(c) AS deleted`
