package main

import (
	"fmt"
	"io"
	"os"
	"time"
)

// progressEvery is how often a progress line that is not on a terminal is
// written at most.
const progressEvery = 5 * time.Second

// isTerminal reports whether w is a terminal: only there can a line be
// rewritten in place.
func isTerminal(w io.Writer) bool {
	f, ok := w.(*os.File)
	if !ok {
		return false
	}
	fi, err := f.Stat()
	return err == nil && fi.Mode()&os.ModeCharDevice != 0
}

// progressLine is the status line of a long operation. On a terminal it is
// one line rewritten in place with "\r". Elsewhere (a log file, a pipe, a
// CI job), where "\r" would pile every update onto one line, each update
// is a line of its own, written only when it changed and at most once
// every progressEvery; the last one is written by Done.
type progressLine struct {
	w     io.Writer
	tty   bool
	every time.Duration
	now   func() time.Time

	written string    // the last update written
	at      time.Time // when it was written
	pending string    // an update held back by every
	open    bool      // on a terminal: a line without its newline
}

func newProgressLine(w io.Writer) *progressLine {
	return &progressLine{w: w, tty: isTerminal(w), every: progressEvery, now: time.Now}
}

// Update shows line as the operation's current state.
func (p *progressLine) Update(line string) {
	if line == p.written {
		p.pending = ""
		return
	}
	if p.tty {
		// Spaces over the rest of a longer previous line.
		fmt.Fprintf(p.w, "\r%-*s", len(p.written), line)
		p.written, p.open = line, true
		return
	}
	if now := p.now(); p.written == "" || now.Sub(p.at) >= p.every {
		fmt.Fprintln(p.w, line)
		p.written, p.at, p.pending = line, now, ""
		return
	}
	p.pending = line
}

// Printf writes a message of its own, on a line after the status line.
func (p *progressLine) Printf(format string, args ...any) {
	p.endLine()
	fmt.Fprintf(p.w, format, args...)
}

// Done writes the last update held back and ends the status line.
func (p *progressLine) Done() {
	if p.pending != "" {
		fmt.Fprintln(p.w, p.pending)
		p.written, p.at, p.pending = p.pending, p.now(), ""
	}
	p.endLine()
}

func (p *progressLine) endLine() {
	if p.open {
		fmt.Fprintln(p.w)
		p.open = false
		// The next update starts a new line: nothing to overwrite.
		p.written = ""
	}
}
