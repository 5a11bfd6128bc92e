// Package testenv provides real infrastructure for tests: one throwaway
// PostgreSQL cluster per test package with a cheap fresh database per test,
// embedded NATS JetStream servers (or servers as processes), and a real
// Neo4j 5 and a real Qdrant server, started once around a whole test run
// by scripts/neo4j-server.sh and scripts/qdrant-server.sh (as make test
// does) or by the test process itself: a test leases an emptied Neo4j
// instance (LeaseNeo4j) or collections of its own name (LeaseQdrant,
// LeaseQdrantKeyed). For runs with TLS on every link: certificates made
// per run (NewCertificates), TLS on the shared cluster (Postgres.EnableTLS),
// a Qdrant instance of a test's own that serves TLS alone (StartQdrantTLS),
// and TLS fronts for a server that offers no TLS (TLSFront) or a tool that
// speaks none (PlainFront).
//
// Tests exercise the same Postgres and NATS code paths as production rather
// than fakes, so the helpers aim to make that cheap: the cluster starts once
// in TestMain (see RunMain), each test gets its own database so tests can
// run in parallel, and NewDatabaseFrom clones a database prepared once (for
// example migrated) instead of re-running the preparation per test.
//
// Typical use:
//
//	var pg *testenv.Postgres
//
//	func TestMain(m *testing.M) { os.Exit(testenv.RunMain(m, &pg)) }
//
//	func TestX(t *testing.T) {
//		t.Parallel()
//		url := pg.NewDatabaseFrom(t, "migrated", migrate)
//		...
//	}
//
// This package is for tests only; production code uses internal/pgcluster.
package testenv
