// Command projector-index is the single writer of the index: it converges
// a Qdrant collection (or the embedded index) to the events of the
// CONVERGE_DOCS stream, and answers searches on GET /v1/search.
package main

import (
	"errors"
	"flag"
	"fmt"
	"os"

	"github.com/converge-sync/converge/internal/index/backends"
)

func main() {
	if err := run(os.Args[1:]); err != nil {
		if errors.Is(err, flag.ErrHelp) {
			os.Exit(0)
		}
		fmt.Fprintln(os.Stderr, "projector-index:", err)
		os.Exit(1)
	}
}

func run(args []string) error { return backends.Main(args) }
