// Package deploy holds the files of the Docker stack that docker-compose.yml
// runs: the NATS server configuration with its users (nats/) and
// secrets.sh, which makes the stack's local secrets (Postgres passwords,
// bearer tokens) in secrets/; and grafana/converge.json, a Grafana
// dashboard of the metrics the services export, whose every query a test
// checks against the metrics the services register. It has no code; its tests check
// docker-compose.yml and the Dockerfile against the binaries they run:
// commands, flags and environment variables as the binaries define them,
// published ports, healthchecks, pinned images, and that each service holds
// its own credentials and no other's (its Postgres role, its NATS user, a
// tokens file where it serves an API), as made by secrets.sh.
package deploy
