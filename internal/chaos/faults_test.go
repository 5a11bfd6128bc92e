//go:build linux

package chaos

import (
	"context"
	"fmt"
	"math/rand/v2"
	"strings"
	"time"

	"github.com/nats-io/nats.go/jetstream"

	"github.com/converge-sync/converge/internal/natsauth"
	"github.com/converge-sync/converge/internal/relay"
	"github.com/converge-sync/converge/pkg/contract"
)

// Fault kinds. A relay's kill and pause are named after its role at the
// time: the active one holds the slot, the standby waits for it.
const (
	kindKillWriter    = "SIGKILL writer"
	kindKillRelayA    = "SIGKILL relay (active)"
	kindKillRelayS    = "SIGKILL relay (standby)"
	kindKillIndex     = "SIGKILL projector-index"
	kindKillGraph     = "SIGKILL projector-graph"
	kindKillNotifier  = "SIGKILL notifier"
	kindPauseWriter   = "SIGSTOP writer"
	kindPauseRelayA   = "SIGSTOP relay (active)"
	kindPauseRelayS   = "SIGSTOP relay (standby)"
	kindPauseIndex    = "SIGSTOP projector-index"
	kindPauseGraph    = "SIGSTOP projector-graph"
	kindPauseNotifier = "SIGSTOP notifier"
	kindReplayIndex   = "converge replay index"
	kindReplayGraph   = "converge replay graph"
	kindCrashPostgres = "Postgres immediate stop"
	kindKillNATS      = "SIGKILL nats-server"
	kindCutLink       = "link cut or frozen (one)"
	kindCutLinks      = "links cut or frozen (2-3)"
	kindClockForward  = "clock jumps forward"
	kindClockBack     = "clock jumps back"
	kindDiskFull      = "NATS disk full"
)

// kinds are the kinds in the matrix's order.
var kinds = []string{kindKillWriter, kindKillRelayA, kindKillRelayS, kindKillIndex, kindKillGraph, kindKillNotifier,
	kindPauseWriter, kindPauseRelayA, kindPauseRelayS, kindPauseIndex, kindPauseGraph, kindPauseNotifier,
	kindReplayIndex, kindReplayGraph, kindCrashPostgres, kindKillNATS, kindCutLink, kindCutLinks,
	kindClockForward, kindClockBack, kindDiskFull}

// choices are what the random source picks from, each equally likely: a
// relay is picked, and its kind follows from its role.
var choices = []string{"kill writer", "kill relay", "kill projector-index", "kill projector-graph", "kill notifier",
	"pause writer", "pause relay", "pause projector-index", "pause projector-graph", "pause notifier",
	"replay index", "replay graph", "crash postgres", "kill nats", "cut links", "jump clock", "fill disk"}

// fault is one injected fault and what the suite saw after it.
type fault struct {
	N      int
	Kind   string
	Start  time.Time
	End    time.Time // the process is back (restarted, resumed) or the command done
	Detail string

	Ready  time.Duration // from End until every service was ready
	Writes time.Duration // from End until the writer acknowledged a write again
	Stream time.Duration // from End until the stream grew again
	Failed string        // a check that did not hold in time
	// Republishes and Resends: the fault can make the relay publish an
	// event again, or the notifier send an effect again (a lost answer).
	Republishes, Resends bool
	Links                []string // the links a link fault cut or froze
	// Slowest names what was still not ready a second before every
	// service was: where the time to ready went.
	Slowest string
}

// inject injects fault n, choice, and brings back what it stopped.
func (p *pipeline) inject(ctx context.Context, rng *rand.Rand, choice string, n int) *fault {
	verb, target, _ := strings.Cut(choice, " ")
	f := &fault{N: n, Start: time.Now()}
	// Each fault draws the same numbers whatever its kind, so that a
	// seed replays the same sequence of choices.
	delay := time.Duration(rng.IntN(1000)) * time.Millisecond
	pause := time.Second + time.Duration(rng.IntN(3000))*time.Millisecond
	pick, from := rng.IntN(2), rng.Float64()
	// Most link faults cut one link alone; the others two or three.
	nLinks := 1
	if several, extra := rng.Float64() >= 0.6, rng.IntN(2); several {
		nLinks = 2 + extra
	}
	freeze, heal := rng.IntN(2) == 1, time.Second+time.Duration(rng.IntN(7000))*time.Millisecond
	linkRng := rand.New(rand.NewPCG(rng.Uint64(), 0x11))
	size, sign, victim := rng.Float64(), rng.Float64(), rng.IntN(1<<20)

	var svc *service
	if target == "relay" {
		active := p.activeRelay()
		relays := []*service{p.service("relay-a"), p.service("relay-b")}
		svc = relays[pick]
		role := "standby"
		if svc == active {
			role = "active"
		}
		target = "relay (" + role + ")"
	} else if verb == "kill" || verb == "pause" {
		if target != "nats" {
			svc = p.service(target)
		}
	}
	switch {
	case verb == "kill" && svc != nil:
		f.Kind = "SIGKILL " + target
		svc.kill()
		time.Sleep(delay)
		svc.start()
		f.Detail = fmt.Sprintf("%s restarted after %v", svc.name, delay)
	case verb == "pause":
		f.Kind = "SIGSTOP " + target
		svc.pause()
		time.Sleep(pause)
		svc.resume()
		f.Detail = fmt.Sprintf("%s paused %v", svc.name, pause.Round(time.Millisecond))
	case verb == "replay":
		f.Kind = "converge replay " + target
		f.Detail = p.replay(ctx, target, from)
	case verb == "crash":
		f.Kind = kindCrashPostgres
		if err := p.pg.Kill(); err != nil {
			f.Failed = fmt.Sprintf("pg_ctl stop -m immediate: %v", err)
		}
		time.Sleep(delay)
		rctx, cancel := context.WithTimeout(ctx, 2*time.Minute)
		err := p.pg.Restart(rctx)
		cancel()
		if err != nil && f.Failed == "" {
			f.Failed = fmt.Sprintf("restart postgres: %v", err)
		}
		f.Detail = fmt.Sprintf("restarted after %v", delay)
	case verb == "cut":
		lf := pickLinks(p.links.list(), linkRng, nLinks, freeze, heal)
		f.Kind = kindCutLink
		if len(lf.links) > 1 {
			f.Kind = kindCutLinks
		}
		for _, l := range lf.links {
			f.Links = append(f.Links, l.String())
			f.Republishes = f.Republishes || strings.HasPrefix(l.service, "relay")
			f.Resends = f.Resends || l.server == "receiver"
			p.service(l.service).logf("link to %s %s", l.server, map[bool]string{true: "frozen", false: "cut"}[lf.freeze])
		}
		lf.apply()
		time.Sleep(lf.heal)
		lf.undo()
		for _, l := range lf.links {
			p.service(l.service).logf("link to %s healed", l.server)
		}
		f.Detail = lf.String()
	case verb == "jump":
		svc = p.services[victim%len(p.services)]
		d := jumpSize(size, sign)
		f.Kind = kindClockForward
		if d < 0 {
			f.Kind = kindClockBack
		}
		off, err := p.clocks.jump(svc.name, d)
		if err != nil {
			f.Failed = fmt.Sprintf("move the clock of %s: %v", svc.name, err)
		}
		svc.logf("wall clock jumps %+v (now %+v off)", d, off)
		f.Detail = fmt.Sprintf("%s by %+v (now %+v off)", svc.name, d, off)
	case verb == "fill":
		f.Kind = kindDiskFull
		f.Republishes, f.Resends = true, true
		f.Detail, f.Failed = p.fillDisk(ctx, pause)
	case verb == "kill" && target == "nats":
		f.Kind = kindKillNATS
		p.nats.Kill()
		time.Sleep(delay)
		if err := p.nats.Start(); err != nil {
			f.Failed = fmt.Sprintf("restart nats-server: %v", err)
		}
		f.Detail = fmt.Sprintf("restarted on its store after %v", delay)
	}
	f.End = time.Now()
	return f
}

// fillDisk fills the NATS server's disk for hold, then frees it. A
// server that met ENOSPC stores nothing more in that stream until it
// restarts, though its health check stays green; the active relay reports
// itself not ready, naming the failure. The suite then restarts the server,
// as the operator alerted by that readiness would; a stalled stream that
// no relay explains fails the fault.
func (p *pipeline) fillDisk(ctx context.Context, hold time.Duration) (detail, failed string) {
	took, err := p.disk.Fill()
	if err != nil {
		_ = p.disk.Free()
		return "", fmt.Sprintf("fill the disk: %v", err)
	}
	time.Sleep(hold)
	if err := p.disk.Free(); err != nil {
		return "", fmt.Sprintf("free the disk: %v", err)
	}
	detail = fmt.Sprintf("%d MiB taken for %v", took>>20, hold.Round(time.Millisecond))
	var last uint64
	if info, err := p.streamInfo(ctx, contract.DocsStream); err == nil {
		last = info.State.LastSeq
	}
	deadline := time.Now().Add(3 * relay.PublishAlarm)
	for time.Now().Before(deadline) {
		if info, err := p.streamInfo(ctx, contract.DocsStream); err == nil && info.State.LastSeq > last {
			return detail + "; the stream grows", ""
		}
		for _, s := range p.services {
			if body := s.readyz(); strings.Contains(body, "publishing to JetStream has failed") {
				s.logf("not ready: %s", body)
				p.nats.Kill()
				if err := p.nats.Start(); err != nil {
					return detail, fmt.Sprintf("restart nats-server: %v", err)
				}
				return detail + "; " + s.name + " reported that JetStream stores nothing: nats-server restarted", ""
			}
		}
		time.Sleep(100 * time.Millisecond)
	}
	return detail, "the stream stalled after the disk had room again, and no relay reported it"
}

// replay moves projector's consumer back to a random sequence of the
// stream (from: where in [first, last]) with `converge replay`, as the
// operator.
func (p *pipeline) replay(ctx context.Context, projector string, from float64) string {
	info, err := p.streamInfo(ctx, contract.DocsStream)
	if err != nil {
		return fmt.Sprintf("no stream info: %v", err)
	}
	first, last := info.State.FirstSeq, info.State.LastSeq
	seq := first + uint64(from*float64(last-first+1))
	seq = max(seq, 1)
	args := []string{"replay", projector, "--from-seq", fmt.Sprint(seq), "-nats-url", p.natsURL, "-nats-user", natsauth.UserOperator}
	cctx, cancel := context.WithTimeout(ctx, time.Minute)
	defer cancel()
	out, err := p.converge(cctx, p.operatorEnv(), args...)
	if err != nil {
		return fmt.Sprintf("from seq %d of %d..%d: FAILED: %v: %s", seq, first, last, err, strings.TrimSpace(out))
	}
	return fmt.Sprintf("from seq %d of %d..%d", seq, first, last)
}

func (p *pipeline) streamInfo(ctx context.Context, name string) (*jetstream.StreamInfo, error) {
	ctx, cancel := context.WithTimeout(ctx, 10*time.Second)
	defer cancel()
	s, err := p.js.Stream(ctx, name)
	if err != nil {
		return nil, err
	}
	return s.Info(ctx)
}

// recovered checks, after f, that every service is ready again, that the
// writer acknowledges writes again and that the stream grows again, each
// within timeout; it records how long each took.
func (p *pipeline) recovered(ctx context.Context, f *fault, l *load, timeout time.Duration) {
	if strings.Contains(f.Detail, "FAILED") && f.Failed == "" {
		f.Failed = f.Detail
	}
	acked := l.acked.Load()
	deadline := f.End.Add(timeout)
	var last uint64
	for time.Now().Before(deadline) && ctx.Err() == nil {
		// After a NATS restart, once the suite's connection is back.
		if info, err := p.streamInfo(ctx, contract.DocsStream); err == nil {
			last = info.State.LastSeq
			break
		}
		time.Sleep(50 * time.Millisecond)
	}
	wait := func(what string, cond func() bool) time.Duration {
		for !cond() {
			if time.Now().After(deadline) || ctx.Err() != nil {
				if f.Failed == "" {
					f.Failed = what + " not within " + timeout.String()
				}
				return -1
			}
			time.Sleep(50 * time.Millisecond)
		}
		return time.Since(f.End)
	}
	var notReady []string
	var notReadyAt time.Time
	f.Ready = wait("every service ready", func() bool {
		var now []string
		for _, s := range p.services {
			if !s.ready() {
				now = append(now, s.name)
			}
		}
		if p.activeRelay() == nil {
			now = append(now, "no relay holding the slot")
		}
		if len(now) > 0 {
			notReady, notReadyAt = now, time.Now()
		}
		return len(now) == 0
	})
	if len(notReady) > 0 && time.Since(notReadyAt) < 2*time.Second && f.Ready > time.Second {
		f.Slowest = strings.Join(notReady, ", ")
	}
	f.Writes = wait("a write acknowledged", func() bool { return l.acked.Load() > acked })
	f.Stream = wait("the stream growing", func() bool {
		info, err := p.streamInfo(ctx, contract.DocsStream)
		return err == nil && info.State.LastSeq > last
	})
}
