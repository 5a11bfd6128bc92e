// Package chaos is converge's chaos suite: every service runs as a real
// binary of its own (the writer, two relays of which one stands by, both
// projectors, the notifier), with its own credentials, against a
// PostgreSQL cluster and a nats-server process that the suite crashes and
// restarts, while producers write and withdraw documents. Faults are chosen
// from a seeded random source (a run is replayed with its seed): SIGKILLs
// and SIGSTOP/SIGCONT pauses of each service, `converge replay` of a
// projector from a random sequence, immediate stops of Postgres and
// SIGKILLs of the NATS server. Once the load ends the suite checks that
// every acknowledged write is in Postgres, that `converge verify` agrees,
// that the stream and the outbox agree event by event (and explains each
// stored duplicate by the fault that preceded it), and that the webhook
// receiver saw each event once; it prints a fault matrix and the figures.
//
// The package holds tests only: `make chaos` runs 200 faults, `make test`
// a short form (see chaos_test.go for the flags).
package chaos
