// Package deploy holds the files of the Docker stack that docker-compose.yml
// runs: the NATS server configuration (nats/server.conf, cluster.conf),
// Postgres' pg_hba.conf (postgres/), and secrets.sh, which makes the
// stack's local secrets in secrets/ (Postgres passwords, bearer tokens, the
// webhook, Qdrant and Neo4j secrets) and runs secretgen, a Go program, for
// what needs more than random bytes (a CA and the servers' certificates,
// the NATS users with bcrypt hashes of their passwords); and
// grafana/converge.json, a Grafana dashboard of the metrics the services
// export, whose every query a test checks against the metrics the services
// register; and prometheus/alerts.yml, Prometheus alerting rules on the
// pipeline and on what converge verify -watch proves, whose every metric
// and label a test checks against the same registries. Its tests check docker-compose.yml and the Dockerfile against
// the binaries they run: commands, flags and environment variables as the
// binaries define them, published ports, healthchecks, pinned images; that
// each service holds its own credentials and no other's (its Postgres role,
// its NATS user, a tokens file where it serves an API), as made by
// secrets.sh, with no default secret in any Compose file; and that
// everything is TLS, verified against the stack's CA, with pg_hba.conf
// admitting the REPLICATION roles from their own containers alone.
package deploy
