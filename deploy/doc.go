// Package deploy holds the files of the Docker stack that docker-compose.yml
// runs: the Postgres roles and grants (postgres/) and the NATS server
// configuration (nats/). It has no code; its tests check docker-compose.yml
// and the Dockerfile against the binaries they run: commands, flags and
// environment variables as the binaries define them, published ports,
// healthchecks, pinned images, and which service gets which credentials.
package deploy
