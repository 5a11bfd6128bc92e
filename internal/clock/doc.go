// Package clock is the wall clock of converge's services for the readings
// that cross processes: the times written into NATS key-value records
// (effect records, leases, relay positions, catch-up records, rebuild
// states), the webhook signature's timestamp, the time reported to
// Postgres, and the ages computed from a time another process wrote (a
// commit time, a mark's time). Services take a [Clock] as a dependency;
// [Wall] is the process's own.
//
// Durations measured inside a process (timeouts, backoffs, a lease term's
// validity, how long a record has been seen unchanged, the metrics of a
// call) are not read from it: they take time.Now's monotonic reading, which
// no step of the wall clock moves. And no decision that must hold for
// correctness compares this process's wall time with another's: hosts'
// clocks disagree, and step forward or back (an NTP step, a VM restored
// from a snapshot). A [Clock]'s Now therefore carries no monotonic reading:
// a duration computed from it is a wall-clock difference, exactly as
// exposed to a jump as the records it is compared with.
//
// # Fault injection
//
// [EnvFaultFile], CONVERGE_FAULT_CLOCK_FILE, is a hook for fault-injection
// tests, not a setting. When it names a file, [Wall] is the system's wall
// clock plus the offset the file holds: a Go duration ("90s", "+90s",
// "-10m", "1h2m3s"; blanks around it ignored). A missing or empty file is
// an offset of 0; content that does not parse is logged once and the last
// offset is kept. The file is read at the first reading and again at most
// every [Reread], so a test moves a running process's wall clock by
// rewriting the file (best by writing another and renaming it over). The
// offset models a real step of the host's wall clock: every wall-clock
// reading of the process moves, while durations measured in the process on
// the monotonic clock do not.
package clock
