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
)

// kinds are the kinds in the matrix's order.
var kinds = []string{kindKillWriter, kindKillRelayA, kindKillRelayS, kindKillIndex, kindKillGraph, kindKillNotifier,
	kindPauseWriter, kindPauseRelayA, kindPauseRelayS, kindPauseIndex, kindPauseGraph, kindPauseNotifier,
	kindReplayIndex, kindReplayGraph, kindCrashPostgres, kindKillNATS}

// choices are what the random source picks from, each equally likely: a
// relay is picked, and its kind follows from its role.
var choices = []string{"kill writer", "kill relay", "kill projector-index", "kill projector-graph", "kill notifier",
	"pause writer", "pause relay", "pause projector-index", "pause projector-graph", "pause notifier",
	"replay index", "replay graph", "crash postgres", "kill nats"}

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
	// Slowest names what was still not ready a second before every
	// service was: where the time to ready went.
	Slowest string
}

// inject picks fault n among choices, injects it, and brings back what it stopped.
func (p *pipeline) inject(ctx context.Context, rng *rand.Rand, choices []string, n int) *fault {
	choice := choices[rng.IntN(len(choices))]
	verb, target, _ := strings.Cut(choice, " ")
	f := &fault{N: n, Start: time.Now()}
	// Each fault draws the same numbers whatever its kind, so that a
	// seed replays the same sequence of choices.
	delay := time.Duration(rng.IntN(1000)) * time.Millisecond
	pause := time.Second + time.Duration(rng.IntN(3000))*time.Millisecond
	pick, from := rng.IntN(2), rng.Float64()

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
