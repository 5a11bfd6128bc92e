// Package pgcluster runs a throwaway PostgreSQL server on the local machine.
//
// It exists so that `converge dev`, `converge demo` and integration tests can
// get a real Postgres with logical replication enabled without asking the user
// to configure one. A cluster is created with initdb, started with pg_ctl,
// bound to 127.0.0.1 only, and trusts every local connection, so it must never
// hold data that matters.
//
// The server binaries (initdb, pg_ctl, postgres) are looked up in this order:
// Config.BinDir, $CONVERGE_PG_BINDIR, `pg_config --bindir`, the directory of
// initdb on $PATH, and finally the newest /usr/lib/postgresql/*/bin. When the
// process runs as root the server runs as the "postgres" OS user, because
// initdb and postgres refuse to run as root.
//
// Layout under the cluster directory:
//
//	data/          the data directory (PGDATA)
//	run/           the Unix socket directory
//	postgres.log   the server log
//
// Settings are written to data/converge.conf, which postgresql.conf includes
// last, so values containing spaces or quotes need no shell quoting and a
// later ALTER SYSTEM still wins.
//
// pg_ctl daemonises the server, so it would outlive a process that dies
// without calling Stop (a panic, `go test -timeout`, SIGKILL). Unless
// Config.NoWatchdog is set, each cluster therefore has a watchdog: a
// detached /bin/sh in its own session that blocks reading a pipe only the
// owner process writes to. When the owner exits, however it dies, the read
// hits EOF and the watchdog stops the server in immediate mode and removes
// the directories Start created as temporary ones. Stop, StopKeep, Kill and
// Restart replace or end it so it only ever guards what the cluster owns.
package pgcluster
