// Command notifier is the one non-idempotent effect of converge: it POSTs
// a signed JSON notification to each configured webhook URL when a
// document version is upserted or withdrawn, at most once per effect id
// within its dedup window (see package notifier).
package main

import (
	"errors"
	"flag"
	"fmt"
	"os"

	"github.com/converge-sync/converge/internal/notifier"
)

func main() {
	if err := run(os.Args[1:]); err != nil {
		if errors.Is(err, flag.ErrHelp) {
			os.Exit(0)
		}
		fmt.Fprintln(os.Stderr, "notifier:", err)
		os.Exit(1)
	}
}

func run(args []string) error { return notifier.Main(args) }
