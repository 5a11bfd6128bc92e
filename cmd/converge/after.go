package main

import (
	"strings"
	"time"

	"github.com/converge-sync/converge/internal/atleast"
	"github.com/converge-sync/converge/internal/config"
)

// writesFlag is a repeatable -after KEY@VERSION (or comma-separated).
type writesFlag []atleast.Write

func (w *writesFlag) String() string {
	parts := make([]string, len(*w))
	for i, x := range *w {
		parts[i] = x.String()
	}
	return strings.Join(parts, ",")
}

func (w *writesFlag) Set(s string) error {
	for part := range strings.SplitSeq(s, ",") {
		x, err := atleast.ParseWrite(strings.TrimSpace(part))
		if err != nil {
			return err
		}
		*w = append(*w, x)
	}
	return nil
}

// bindAfter binds -after and -wait, read your writes: the read waits until
// the projection holds each write named (what the writer answered for
// it), at most -wait.
func bindAfter(f *config.Flags) (*writesFlag, *time.Duration) {
	var after writesFlag
	f.Var(&after, "after", "KEY@VERSION of a write (what the writer answered) the read must see: it waits until the projection holds it, at most -wait (repeatable, or comma-separated)")
	wait := f.Duration("wait", "", 0, "how long a read with -after waits at most (0: the projector's 5s; at most 1m)")
	return &after, wait
}
