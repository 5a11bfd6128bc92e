// Package chaos is converge's chaos suite: every service runs as a real
// binary of its own (the writer, two relays of which one stands by, both
// projectors on the embedded stores, or the index in a collection of the
// test Qdrant server when the run has one, the notifier to a local
// receiver),
// each with its own Postgres role, NATS user and tokens, against a
// PostgreSQL cluster and a nats-server process that the suite crashes and
// restarts, while producers write and withdraw documents. Faults are chosen
// from a seeded random source (a run's faults are replayed with its seed):
// SIGKILLs and SIGSTOP/SIGCONT pauses of each service, `converge replay` of
// a projector from a random sequence, immediate stops of Postgres and
// SIGKILLs of the NATS server, each restarted on its data; link faults:
// every service reaches every server it uses (Postgres, NATS, Qdrant,
// Neo4j, the webhook receiver) through a TCP proxy of its own
// (internal/netfault), and a fault cuts (connections closed, new ones
// black-holed) or freezes (nothing forwarded, as packets dropped) one link,
// or two or three at once, healing them after 1-8 s while both ends keep
// running; clock jumps: a service's wall clock (internal/clock, through
// CONVERGE_FAULT_CLOCK_FILE) steps forward or back by 10 s to 20 min and
// stays there; a full disk: the NATS server's store is a tmpfs of its own
// (where the machine lets the suite mount one) that a fault fills to the
// last byte for 1-4 s. A NATS server that met ENOSPC stores nothing more in
// that stream until it restarts; the relay reports it on /readyz and the
// suite restarts the server, as the operator that readiness alerts would.
//
// After each fault the suite waits until every service is ready, a relay
// holds the slot, a write is acknowledged and the stream grows. Once the
// load ends it checks that every acknowledged write is in Postgres at its
// version (or a newer one), that `converge verify` exits 0 (and how long
// after the load that took), that the stream and the outbox agree event by
// event, that the receiver saw one Idempotency-Key per event, every event,
// and no effect answered 2xx twice; it counts the duplicates the stream
// stored over the run (read as they are stored, since the per-subject
// history purges them) by the fault that preceded them, and prints a fault
// matrix and a summary.
//
// The package holds tests only (TestChaos, skipped with -short):
//
//	make chaos                                    # 200 faults (CHAOS_FAULTS, CHAOS_SEED, CHAOS_FLAGS)
//	go test ./internal/chaos -run TestChaos -v    # the short form of make test: each kind of fault once
//	go test ./internal/chaos -run TestChaos -v -chaos.faults=0 -chaos.duration=60s
//	                                              # the load alone: notifications received / events
//
// Flags: -chaos.faults, -chaos.seed, -chaos.duration, -chaos.interval,
// -chaos.kinds, -chaos.docs, -chaos.producers, -chaos.rate,
// -chaos.history (-1: the stream keeps every event, checked one by one),
// -chaos.recovery, -chaos.settle, -chaos.receiver-failures,
// -chaos.receiver-delay, -chaos.logs, -chaos.index (embedded, qdrant, or
// auto: Qdrant when the test run has a server, as make test does).
package chaos
