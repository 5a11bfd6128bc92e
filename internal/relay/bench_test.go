package relay_test

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"net/url"
	"os"
	"os/exec"
	"path/filepath"
	"runtime/pprof"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"testing"
	"time"

	"github.com/jackc/pglogrepl"
	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"
	"github.com/jackc/pgx/v5/pgproto3"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/converge-sync/converge/internal/benchsummary"
	"github.com/converge-sync/converge/internal/pgcluster"
	"github.com/converge-sync/converge/internal/relay"
	"github.com/converge-sync/converge/internal/testenv"

	"github.com/converge-sync/converge/pkg/contract"
)

const (
	backlogEvents  = 200_000
	backlogTxRows  = 100
	backlogKeys    = 50_000
	benchSlot      = "converge_bench_decode"
	benchRecvSlot  = "converge_bench_recvlogical"
	benchRelaySlot = "converge_relay" // the relay's default, which it resumes from
	backlogTimeout = 5 * time.Minute
)

// BenchmarkRelayBacklog compares, in one run, the relay end to end (a child
// process publishing into a file-backed stream) with two limits on the same
// prefilled backlog of 200,000 1 KB events in 100-row transactions: the
// decode limit (a pglogrepl loop doing the relay's decoding without
// publishing) and PostgreSQL's own pg_recvlogical decoding the same WAL with
// the same plugin and publication into /dev/null. Each iteration is a full
// run on a fresh database, the sides in a rotating order; use -benchtime 1x
// and -count 3 so that each side runs once in each position.
func BenchmarkRelayBacklog(b *testing.B) {
	recvlogical := recvlogicalPath(b)
	var decodeTime, relayTime, recvTime time.Duration
	var peakRSS int64
	for i := 0; i < b.N; i++ {
		b.StopTimer()
		it := newBacklogRun(b)
		b.StartTimer()
		var d, r, p sideResult
		sides := []struct {
			name string
			run  func()
		}{
			{"decode", func() { d = it.decode(b) }},
			{"pg_recvlogical", func() { p = it.recvlogical(b, recvlogical) }},
			{"relay", func() { r = it.relay(b) }},
		}
		// Across the calls of -count too: each side takes each place in turn.
		round := backlogRounds.Add(1) - 1
		var order []string
		for k := range sides {
			side := sides[(int(round)+k)%len(sides)]
			order = append(order, side.name)
			side.run()
		}
		b.StopTimer()
		if err := it.close(); err != nil {
			b.Fatal(err)
		}
		decodeTime += d.elapsed
		relayTime += r.elapsed
		recvTime += p.elapsed
		peakRSS = max(peakRSS, r.peakRSS)
		b.Logf("iteration %d (order %s): pg_recvlogical %.0f events/s (%v), decode %.0f events/s (%v), relay %.0f events/s (%v); relay/pg_recvlogical %.2f, relay/decode %.2f, relay peak RSS %.1f MiB",
			i+1, strings.Join(order, ", "), eventsPerSecond(backlogEvents, p.elapsed), p.elapsed.Round(time.Millisecond),
			eventsPerSecond(backlogEvents, d.elapsed), d.elapsed.Round(time.Millisecond), eventsPerSecond(backlogEvents, r.elapsed),
			r.elapsed.Round(time.Millisecond), p.elapsed.Seconds()/r.elapsed.Seconds(), d.elapsed.Seconds()/r.elapsed.Seconds(),
			float64(r.peakRSS)/(1<<20))
		// CPU per event tells a starved pipeline (the sum near cores x
		// elapsed) from one waiting on itself.
		b.Logf("iteration %d: CPU µs/event: pg_recvlogical side: walsender %.1f, pg_recvlogical %.1f; decode side: walsender %.1f, decode loop %.1f; relay side: walsender %.1f, relay %.1f, nats-server %.1f",
			i+1, perEvent(p.walsenderCPU), perEvent(p.clientCPU), perEvent(d.walsenderCPU), perEvent(d.clientCPU),
			perEvent(r.walsenderCPU), perEvent(r.clientCPU), perEvent(r.natsCPU))
	}
	decodeRate := eventsPerSecond(b.N*backlogEvents, decodeTime)
	relayRate := eventsPerSecond(b.N*backlogEvents, relayTime)
	recvRate := eventsPerSecond(b.N*backlogEvents, recvTime)
	ratio := relayRate / decodeRate
	recvRatio := relayRate / recvRate
	rssMiB := float64(peakRSS) / (1 << 20)
	b.ReportMetric(recvRate, "recvlogical_events/s")
	b.ReportMetric(decodeRate, "decode_events/s")
	b.ReportMetric(relayRate, "relay_events/s")
	b.ReportMetric(recvRatio, "ratio_recvlogical")
	b.ReportMetric(ratio, "ratio")
	b.ReportMetric(rssMiB, "relay_peak_rss_MiB")
	b.Logf("relay backlog of %d 1 KB events: pg_recvlogical %.0f events/s, relay %.0f events/s, relay/pg_recvlogical %.2f (target >= 0.70)",
		backlogEvents, recvRate, relayRate, recvRatio)
	b.Logf("relay backlog of %d 1 KB events: decode limit %.0f events/s, relay %.0f events/s, ratio %.2f (target >= 0.60), relay peak RSS %.1f MiB (target < 100)",
		backlogEvents, decodeRate, relayRate, ratio, rssMiB)
	benchsummary.Log(b, benchsummary.Row{Target: "relay / pg_recvlogical, backlog of 200,000 1 KB events",
		Figure: fmt.Sprintf("%.0f events/s", relayRate), Limit: fmt.Sprintf("%.0f events/s", recvRate), Ratio: recvRatio,
		Goal: ">= 0.70", Met: recvRatio >= 0.7})
	benchsummary.Log(b, benchsummary.Row{Target: "relay peak RSS over the backlog (flat: bounded by the window)",
		Figure: fmt.Sprintf("%.1f MiB", rssMiB), Limit: "100 MiB", Ratio: rssMiB / 100, Goal: "< 1", Met: rssMiB < 100})
}

// backlogRounds counts the iterations of every call of
// BenchmarkRelayBacklog in this process: it rotates the order of the sides.
var backlogRounds atomic.Int64

// backlogProfiles numbers the relay sides' profiles.
var backlogProfiles atomic.Int64

func eventsPerSecond(events int, d time.Duration) float64 { return float64(events) / d.Seconds() }

func perEvent(cpu time.Duration) float64 { return float64(cpu.Microseconds()) / backlogEvents }

// sideResult is one side's figures: elapsed time, and CPU time of the
// walsender, of the consumer (the relay process, or this process while the
// decode loop runs) and, for the relay, of the embedded nats-server (this
// process while the relay runs).
type sideResult struct {
	elapsed                          time.Duration
	walsenderCPU, clientCPU, natsCPU time.Duration
	peakRSS                          int64
}

// backlogRun is one iteration's database, slots and NATS server. They are
// released at the end of the iteration rather than of the benchmark, so that
// the retained WAL and the stream's files do not pile up over iterations.
type backlogRun struct {
	dbURL     string
	dbName    string
	endLSN    pglogrepl.LSN // the WAL position after the prefill
	monitor   *pgx.Conn     // finds walsender pids
	nats      *testenv.NATS
	storeDir  string
	closeOnce sync.Once
	closeErr  error
}

func newBacklogRun(b *testing.B) *backlogRun {
	b.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), backlogTimeout)
	defer cancel()
	it := &backlogRun{dbURL: pg.MigratedDatabase(b)}
	cfg, err := pgx.ParseConfig(it.dbURL)
	if err != nil {
		b.Fatal(err)
	}
	it.dbName = cfg.Database
	// Registered after the database's own cleanup, so it runs first: a
	// database holding a slot cannot be dropped.
	b.Cleanup(func() {
		if err := it.close(); err != nil {
			b.Error(err)
		}
	})

	conn, err := pgx.Connect(ctx, it.dbURL)
	if err != nil {
		b.Fatal(err)
	}
	defer conn.Close(context.Background())
	// Every slot exists before the backlog is written, so each sees all of it.
	for _, slot := range []string{benchSlot, benchRecvSlot, benchRelaySlot} {
		if _, err := conn.Exec(ctx, `SELECT pg_create_logical_replication_slot($1, 'pgoutput')`, slot); err != nil {
			b.Fatalf("create slot %s: %v", slot, err)
		}
	}
	// One server-side loop committing every 100 rows: the backlog takes
	// seconds to write, not a round trip per transaction. COMMIT inside DO
	// needs the simple protocol.
	prefill := fmt.Sprintf(`DO $$
DECLARE
	pad constant text := repeat('converge relay backlog ', 37);
BEGIN
	FOR t IN 0 .. %[1]d - 1 LOOP
		INSERT INTO outbox (event_id, key, version, kind, payload)
		SELECT gen_random_uuid(), 'doc-' || (i %% %[3]d), i / %[3]d + 1, 'document.upserted',
			format('{"schema":"converge.event.v1","kind":"document.upserted","key":"doc-%%s","version":%%s,"title":"backlog document %%s","links":[],"tags":[],"meta":{},"chunks":[{"ordinal":0,"text":"%%s"}]}',
				i %% %[3]d, i / %[3]d + 1, i, pad)::json
		FROM generate_series(t * %[2]d, t * %[2]d + %[2]d - 1) AS i;
		COMMIT;
	END LOOP;
END $$`, backlogEvents/backlogTxRows, backlogTxRows, backlogKeys)
	start := time.Now()
	if _, err := conn.PgConn().Exec(ctx, prefill).ReadAll(); err != nil {
		b.Fatalf("prefill: %v", err)
	}
	var end string
	if err := conn.QueryRow(ctx, `SELECT pg_current_wal_lsn()::text`).Scan(&end); err != nil {
		b.Fatal(err)
	}
	if it.endLSN, err = pglogrepl.ParseLSN(end); err != nil {
		b.Fatal(err)
	}
	var rows int
	var avg float64
	if err := conn.QueryRow(ctx, `SELECT count(*), avg(octet_length(payload::text)) FROM outbox`).Scan(&rows, &avg); err != nil {
		b.Fatal(err)
	}
	if rows != backlogEvents {
		b.Fatalf("prefilled %d rows, want %d", rows, backlogEvents)
	}
	b.Logf("prefilled %d events (payload %.0f bytes on average) in %v", rows, avg, time.Since(start).Round(time.Millisecond))

	if it.monitor, err = pgx.Connect(ctx, pg.Cluster.URL("postgres")); err != nil {
		b.Fatal(err)
	}
	it.storeDir, err = os.MkdirTemp("", "relay-bench-nats-")
	if err != nil {
		b.Fatal(err)
	}
	if it.nats, err = testenv.StartNATSAt(it.storeDir, -1); err != nil {
		b.Fatal(err)
	}
	return it
}

// close stops NATS, drops both slots (waiting for their walsenders to exit)
// and the database. It is idempotent.
func (it *backlogRun) close() error {
	it.closeOnce.Do(func() {
		if it.nats != nil {
			it.nats.Shutdown()
		}
		if it.storeDir != "" {
			_ = os.RemoveAll(it.storeDir)
		}
		ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
		defer cancel()
		if it.monitor != nil {
			_ = it.monitor.Close(ctx)
		}
		admin, err := pgx.Connect(ctx, pg.Cluster.URL("postgres"))
		if err != nil {
			it.closeErr = err
			return
		}
		defer admin.Close(context.Background())
		for _, slot := range []string{benchSlot, benchRecvSlot, benchRelaySlot} {
			if err := dropSlotWhenInactive(ctx, admin, it.dbName, slot); err != nil {
				it.closeErr = errors.Join(it.closeErr, err)
			}
		}
		if it.closeErr == nil {
			_, it.closeErr = admin.Exec(ctx, "DROP DATABASE IF EXISTS "+pgx.Identifier{it.dbName}.Sanitize()+" WITH (FORCE)")
		}
	})
	return it.closeErr
}

// dropSlotWhenInactive drops a slot of the database once no walsender holds
// it: a walsender exits shortly after its client disconnects.
func dropSlotWhenInactive(ctx context.Context, conn *pgx.Conn, db, slot string) error {
	for {
		_, err := conn.Exec(ctx, `SELECT pg_drop_replication_slot(slot_name) FROM pg_replication_slots
			WHERE slot_name = $1 AND database = $2 AND NOT active`, slot, db)
		if err != nil {
			return fmt.Errorf("drop slot %s: %w", slot, err)
		}
		var left bool
		if err := conn.QueryRow(ctx, `SELECT EXISTS (SELECT 1 FROM pg_replication_slots WHERE slot_name = $1 AND database = $2)`,
			slot, db).Scan(&left); err != nil {
			return fmt.Errorf("drop slot %s: %w", slot, err)
		}
		if !left {
			return nil
		}
		select {
		case <-ctx.Done():
			return fmt.Errorf("drop slot %s: still active: %w", slot, ctx.Err())
		case <-time.After(50 * time.Millisecond):
		}
	}
}

// outboxColumns are the positions of the outbox columns the relay reads.
type outboxColumns struct{ eventID, key, version, kind, payload int }

// decode reads the backlog from the benchmark's own slot with the relay's
// plugin arguments and does the relay's per-event work short of publishing:
// parse each message, extract and copy the columns, parse the version. It
// reports standby status like the relay. It returns the time from connecting
// until the last insert was decoded.
func (it *backlogRun) decode(b *testing.B) sideResult {
	b.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), backlogTimeout)
	defer cancel()
	u, err := url.Parse(it.dbURL)
	if err != nil {
		b.Fatal(err)
	}
	q := u.Query()
	q.Set("replication", "database")
	u.RawQuery = q.Encode()

	start := time.Now()
	conn, err := pgconn.Connect(ctx, u.String())
	if err != nil {
		b.Fatal(err)
	}
	defer conn.Close(context.Background())
	if err := pglogrepl.StartReplication(ctx, conn, benchSlot, 0, pglogrepl.StartReplicationOptions{
		PluginArgs: []string{"proto_version '1'", "publication_names 'converge_outbox'", "messages 'true'"},
	}); err != nil {
		b.Fatal(err)
	}
	walsender, err := it.walsenderPID(ctx, benchSlot)
	if err != nil {
		b.Fatal(err)
	}
	selfStart := selfCPU()
	var (
		relations = map[uint32]outboxColumns{}
		confirmed pglogrepl.LSN
		inserts   int
		decoded   int
	)
	sendStatus := func() {
		if err := pglogrepl.SendStandbyStatusUpdate(ctx, conn, pglogrepl.StandbyStatusUpdate{
			WALWritePosition: confirmed, WALFlushPosition: confirmed, WALApplyPosition: confirmed, ClientTime: time.Now(),
		}); err != nil {
			b.Fatal(err)
		}
	}
	nextStatus := time.Now().Add(time.Second)
	for inserts < backlogEvents {
		if time.Now().After(nextStatus) {
			sendStatus()
			nextStatus = time.Now().Add(time.Second)
		}
		msg, err := conn.ReceiveMessage(ctx)
		if err != nil {
			b.Fatalf("decode: receive after %d inserts: %v", inserts, err)
		}
		cd, ok := msg.(*pgproto3.CopyData)
		if !ok {
			b.Fatalf("decode: unexpected message %T", msg)
		}
		if len(cd.Data) == 0 {
			continue
		}
		switch cd.Data[0] {
		case pglogrepl.PrimaryKeepaliveMessageByteID:
			ka, err := pglogrepl.ParsePrimaryKeepaliveMessage(cd.Data[1:])
			if err != nil {
				b.Fatal(err)
			}
			if ka.ReplyRequested {
				sendStatus()
			}
		case pglogrepl.XLogDataByteID:
			xld, err := pglogrepl.ParseXLogData(cd.Data[1:])
			if err != nil {
				b.Fatal(err)
			}
			m, err := pglogrepl.Parse(xld.WALData)
			if err != nil {
				b.Fatal(err)
			}
			switch m := m.(type) {
			case *pglogrepl.RelationMessage:
				c := outboxColumns{-1, -1, -1, -1, -1}
				for i, col := range m.Columns {
					switch col.Name {
					case "event_id":
						c.eventID = i
					case "key":
						c.key = i
					case "version":
						c.version = i
					case "kind":
						c.kind = i
					case "payload":
						c.payload = i
					}
				}
				relations[m.RelationID] = c
			case *pglogrepl.InsertMessage:
				c, ok := relations[m.RelationID]
				if !ok {
					continue
				}
				cols := m.Tuple.Columns
				for _, i := range []int{c.eventID, c.key, c.version, c.kind, c.payload} {
					if i < 0 || i >= len(cols) || cols[i].DataType != pglogrepl.TupleDataTypeText {
						b.Fatalf("decode: outbox column %d missing or not text", i)
					}
				}
				eventID, key, kind := string(cols[c.eventID].Data), string(cols[c.key].Data), string(cols[c.kind].Data)
				if _, err := strconv.ParseInt(string(cols[c.version].Data), 10, 64); err != nil {
					b.Fatal(err)
				}
				// Copied as the relay must: the tuple points into the receive buffer.
				payload := append([]byte(nil), cols[c.payload].Data...)
				decoded += len(eventID) + len(key) + len(kind) + len(payload)
				inserts++
			case *pglogrepl.CommitMessage:
				// Nothing downstream to wait for: a commit is confirmable at once.
				confirmed = m.TransactionEndLSN
			}
		}
	}
	res := sideResult{elapsed: time.Since(start), clientCPU: selfCPU() - selfStart}
	// The walsender was started by this connection: its total is this run's.
	if res.walsenderCPU, err = procCPU(walsender); err != nil {
		b.Logf("decode: walsender CPU unavailable: %v", err)
	}
	sendStatus()
	if decoded < backlogEvents*1000 {
		b.Fatalf("decode: %d bytes of events, want at least 1 KB each", decoded)
	}
	return res
}

// recvlogicalPath is PostgreSQL's pg_recvlogical, beside the server
// binaries the test cluster runs.
func recvlogicalPath(b *testing.B) string {
	b.Helper()
	dir, err := pgcluster.FindBinDir("")
	if err != nil {
		b.Fatal(err)
	}
	path := filepath.Join(dir, "pg_recvlogical")
	if _, err := os.Stat(path); err != nil {
		b.Fatalf("pg_recvlogical: %v", err)
	}
	return path
}

// recvlogical runs pg_recvlogical on its own slot, with the relay's plugin
// arguments, writing what it decodes to /dev/null and stopping by itself at
// the WAL position after the prefill. It returns the time from starting it
// until it exited, its CPU time and its walsender's.
func (it *backlogRun) recvlogical(b *testing.B, path string) sideResult {
	b.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), backlogTimeout)
	defer cancel()
	var stderr testenv.Buffer
	cmd := exec.CommandContext(ctx, path, "--dbname", it.dbURL, "--slot", benchRecvSlot, "--start",
		"--file", "/dev/null", "--endpos", it.endLSN.String(), "--no-loop",
		"-o", "proto_version=1", "-o", "publication_names=converge_outbox", "-o", "messages=true")
	cmd.Stderr = &stderr
	start := time.Now()
	if err := cmd.Start(); err != nil {
		b.Fatal(err)
	}
	exited := make(chan error, 1)
	go func() { exited <- cmd.Wait() }()
	// The walsender exits with its client: its CPU is read until then.
	var walsender int
	var walsenderCPU time.Duration
	poll := time.NewTicker(10 * time.Millisecond)
	defer poll.Stop()
	for {
		select {
		case err := <-exited:
			elapsed := time.Since(start)
			if err != nil {
				b.Fatalf("pg_recvlogical: %v\n%s", err, stderr.String())
			}
			if walsender == 0 {
				b.Logf("pg_recvlogical: walsender not seen")
			}
			if err := it.checkSlotAt(ctx, benchRecvSlot); err != nil {
				b.Fatal(err)
			}
			return sideResult{elapsed: elapsed, walsenderCPU: walsenderCPU,
				clientCPU: cmd.ProcessState.UserTime() + cmd.ProcessState.SystemTime()}
		case <-poll.C:
			if walsender == 0 {
				pid, err := it.walsenderPID(ctx, benchRecvSlot)
				if err != nil {
					b.Fatal(err)
				}
				walsender = pid
			}
			if walsender != 0 {
				if cpu, err := procCPU(walsender); err == nil {
					walsenderCPU = cpu
				}
			}
		}
	}
}

// checkSlotAt fails unless the slot has confirmed the WAL position after the
// prefill: the whole backlog was received.
func (it *backlogRun) checkSlotAt(ctx context.Context, slot string) error {
	var confirmed string
	if err := it.monitor.QueryRow(ctx, `SELECT coalesce(confirmed_flush_lsn::text, '0/0') FROM pg_replication_slots WHERE slot_name = $1 AND database = $2`,
		slot, it.dbName).Scan(&confirmed); err != nil {
		return fmt.Errorf("slot %s: %w", slot, err)
	}
	lsn, err := pglogrepl.ParseLSN(confirmed)
	if err != nil {
		return fmt.Errorf("slot %s: %w", slot, err)
	}
	if lsn < it.endLSN {
		return fmt.Errorf("slot %s confirmed %s, before the end of the backlog %s", slot, lsn, it.endLSN)
	}
	return nil
}

// walsenderPID is the pid of the walsender streaming the slot.
func (it *backlogRun) walsenderPID(ctx context.Context, slot string) (int, error) {
	var pid *int32
	err := it.monitor.QueryRow(ctx, `SELECT active_pid FROM pg_replication_slots WHERE slot_name = $1 AND database = $2`,
		slot, it.dbName).Scan(&pid)
	if err != nil {
		return 0, fmt.Errorf("walsender of slot %s: %w", slot, err)
	}
	if pid == nil {
		return 0, nil
	}
	return int(*pid), nil
}

// relay runs the relay as a child process (the test binary in child mode,
// see TestMain) so that its memory is measured alone, and returns the time
// from starting it until the stream holds the whole backlog, and its peak
// RSS in bytes.
func (it *backlogRun) relay(b *testing.B) sideResult {
	b.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), backlogTimeout)
	defer cancel()
	nc := it.nats.Connect(b)
	defer nc.Close()
	js, err := jetstream.New(nc)
	if err != nil {
		b.Fatal(err)
	}
	it.seedPosition(b, ctx, js)

	var stderr testenv.LockedBuffer
	cmd := exec.Command(os.Args[0])
	// CONVERGE_RELAY_WINDOW and CONVERGE_RELAY_STREAM_HISTORY, when set,
	// pass through to the child.
	cmd.Env = append(os.Environ(), childEnv+"=1", "CONVERGE_POSTGRES_URL="+it.dbURL, "CONVERGE_NATS_URL="+it.nats.URL)
	cmd.Stderr = &stderr
	// With CONVERGE_BENCH_PROFILE_DIR set, the relay side writes CPU
	// profiles of the relay child and of this process (the nats-server,
	// mostly) while the relay runs.
	if dir := os.Getenv("CONVERGE_BENCH_PROFILE_DIR"); dir != "" {
		n := backlogProfiles.Add(1)
		cmd.Env = append(cmd.Env, "CONVERGE_RELAY_CPUPROFILE="+filepath.Join(dir, fmt.Sprintf("relay-%d.pprof", n)))
		f, err := os.Create(filepath.Join(dir, fmt.Sprintf("nats-%d.pprof", n)))
		if err != nil {
			b.Fatal(err)
		}
		if err := pprof.StartCPUProfile(f); err != nil {
			b.Fatal(err)
		}
		defer func() { pprof.StopCPUProfile(); _ = f.Close() }()
	}
	selfStart := selfCPU()
	start := time.Now()
	if err := cmd.Start(); err != nil {
		b.Fatal(err)
	}
	exited := make(chan error, 1)
	go func() { exited <- cmd.Wait() }()
	stopped := false
	defer func() {
		if !stopped {
			_ = cmd.Process.Kill()
			<-exited
		}
	}()
	pid := cmd.Process.Pid

	// VmHWM is the kernel's own peak; the samples guard against a kernel
	// that does not report it.
	var sampledPeak int64
	sample := time.NewTicker(50 * time.Millisecond)
	defer sample.Stop()
	poll := time.NewTicker(20 * time.Millisecond)
	defer poll.Stop()
	var stream jetstream.Stream
	var elapsed time.Duration
	walsender := 0
	for elapsed == 0 {
		select {
		case <-ctx.Done():
			b.Fatalf("relay: the stream did not reach %d messages within %v\n%s", backlogEvents, backlogTimeout, stderr.String())
		case err := <-exited:
			stopped = true
			b.Fatalf("relay: child exited early: %v\n%s", err, stderr.String())
		case <-sample.C:
			if rss, err := procStatusBytes(pid, "VmRSS"); err == nil {
				sampledPeak = max(sampledPeak, rss)
			}
		case <-poll.C:
			if walsender == 0 {
				if walsender, err = it.walsenderPID(ctx, benchRelaySlot); err != nil {
					b.Fatal(err)
				}
			}
			if stream == nil {
				if stream, err = js.Stream(ctx, contract.DocsStream); err != nil {
					stream = nil // not created yet
					continue
				}
			}
			info, err := stream.Info(ctx)
			if err != nil {
				b.Fatal(err)
			}
			if info.State.Msgs >= backlogEvents {
				elapsed = time.Since(start)
			}
		}
	}
	hwm, err := procStatusBytes(pid, "VmHWM")
	if err != nil {
		b.Logf("relay: VmHWM unavailable (%v); using sampled VmRSS", err)
	}
	res := sideResult{elapsed: elapsed, peakRSS: max(hwm, sampledPeak), natsCPU: selfCPU() - selfStart}
	if res.clientCPU, err = procCPU(pid); err != nil {
		b.Logf("relay: CPU unavailable: %v", err)
	}
	if walsender == 0 {
		b.Logf("relay: walsender not seen")
	} else if res.walsenderCPU, err = procCPU(walsender); err != nil {
		b.Logf("relay: walsender CPU unavailable: %v", err)
	}

	if err := cmd.Process.Signal(syscall.SIGTERM); err != nil {
		b.Fatal(err)
	}
	select {
	case err := <-exited:
		stopped = true
		if err != nil {
			b.Fatalf("relay: child exited with %v\n%s", err, stderr.String())
		}
	case <-time.After(time.Minute):
		b.Fatalf("relay: child did not stop within a minute of SIGTERM\n%s", stderr.String())
	}
	// Every event exactly once: none lost, no duplicate stored.
	info, err := stream.Info(ctx)
	if err != nil {
		b.Fatal(err)
	}
	if info.State.Msgs != backlogEvents {
		b.Fatalf("relay: the stream holds %d messages, want %d", info.State.Msgs, backlogEvents)
	}
	// A session that ended in an error and resumed would skew the figures.
	if log := stderr.String(); strings.Contains(log, "level=ERROR") || strings.Contains(log, "level=WARN") {
		b.Logf("relay log:\n%s", log)
	}
	return res
}

// procCPU is the user plus system time a process has used so far.
func procCPU(pid int) (time.Duration, error) {
	stat, err := os.ReadFile("/proc/" + strconv.Itoa(pid) + "/stat")
	if err != nil {
		return 0, err
	}
	// Fields after the command, which may hold spaces, start at field 3;
	// utime and stime are fields 14 and 15, in clock ticks of 1/100 s
	// (USER_HZ on Linux).
	i := bytes.LastIndexByte(stat, ')')
	if i < 0 {
		return 0, fmt.Errorf("/proc/%d/stat: unexpected format", pid)
	}
	f := strings.Fields(string(stat[i+1:]))
	if len(f) < 13 {
		return 0, fmt.Errorf("/proc/%d/stat: unexpected format", pid)
	}
	var ticks int64
	for _, s := range f[11:13] {
		n, err := strconv.ParseInt(s, 10, 64)
		if err != nil {
			return 0, fmt.Errorf("/proc/%d/stat: %w", pid, err)
		}
		ticks += n
	}
	return time.Duration(ticks) * 10 * time.Millisecond, nil
}

// selfCPU is the user plus system time this process has used so far.
func selfCPU() time.Duration {
	var ru syscall.Rusage
	if err := syscall.Getrusage(syscall.RUSAGE_SELF, &ru); err != nil {
		return 0
	}
	return time.Duration(ru.Utime.Nano() + ru.Stime.Nano())
}

// seedPosition records the relay slot's position as a relay that ran
// before this backlog was written would have: the relay trusts its slot
// and streams the backlog from it, which is what the benchmark measures,
// instead of catching up from the outbox as on a first start.
func (it *backlogRun) seedPosition(b *testing.B, ctx context.Context, js jetstream.JetStream) {
	b.Helper()
	conn, err := pgx.Connect(ctx, it.dbURL)
	if err != nil {
		b.Fatal(err)
	}
	defer conn.Close(context.Background())
	var rec relay.Position
	if err := conn.QueryRow(ctx, `SELECT confirmed_flush_lsn::text, (SELECT system_identifier::text FROM pg_control_system()),
		(SELECT timeline_id FROM pg_control_checkpoint()) FROM pg_replication_slots WHERE slot_name = $1`, benchRelaySlot).Scan(&rec.LSN, &rec.SystemID, &rec.Timeline); err != nil {
		b.Fatal(err)
	}
	rec.At = time.Now().UTC()
	if _, err := relay.OpenPositions(ctx, js, benchRelaySlot, 1); err != nil {
		b.Fatal(err)
	}
	kv, err := js.KeyValue(ctx, relay.PositionBucket)
	if err != nil {
		b.Fatal(err)
	}
	data, err := json.Marshal(rec)
	if err != nil {
		b.Fatal(err)
	}
	if _, err := kv.Put(ctx, benchRelaySlot, data); err != nil {
		b.Fatal(err)
	}
}
