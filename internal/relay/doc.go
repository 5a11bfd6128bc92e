// Package relay moves the outbox from Postgres to JetStream: it is the only
// publisher of the CONVERGE_DOCS stream.
//
// It reads inserts into the outbox table through a logical replication slot
// (pgoutput, on the converge_outbox publication) and publishes each event to
// converge.docs.<token> with Nats-Msg-Id set to the event id, asynchronously,
// with at most Config.Window publishes awaiting their acknowledgement.
//
// # Re-emissions
//
// An outbox row whose emission column is not 0 re-emits an event already
// emitted (converge backfill, converge verify --repair): it is published
// with Nats-Msg-Id "<event id>.<emission>", which the duplicate window has
// not seen, and the header contract.HeaderReemission, which makes the
// projectors rewrite a version they already hold. A republished
// re-emission (after a crash) has the same id and is dropped like any
// other. An outbox without the column (schema version 1) holds original
// emissions only; the relay reads either, and takes the column on when a
// migration adds it while it runs.
//
// # What is confirmed when
//
// Postgres is told that the relay has flushed a position (a standby status
// update) only for the end LSN of a transaction whose every event
// JetStream has acknowledged, together with every transaction before it.
// Acknowledgements are consumed in publish order, so the confirmed position
// never passes an event that is not stored. When nothing is in flight, the
// position of a keepalive or heartbeat is confirmed, so that an idle outbox
// does not pin WAL.
//
// # What a crash leaves
//
//   - Relay killed: the slot restarts from the last confirmed position; the
//     events after it are published again. Those JetStream already stored
//     are dropped by its duplicate window (same Nats-Msg-Id); beyond the
//     window, consumers are idempotent by the contract.
//   - Postgres crash: the slot position is saved at checkpoints, so it can
//     move back and resend confirmed transactions: same treatment.
//   - NATS down or restarted: publishes fail, the session ends without
//     confirming them, and the relay reconnects and resumes from the last
//     confirmed position.
//
// # One active relay
//
// A logical slot admits one consumer. A second relay finds the slot active,
// waits as a standby and retries; when the active relay dies its walsender
// exits and the standby takes over from the confirmed position.
package relay
