// Command projector-graph is the single writer of the graph: it converges
// a Neo4j database (or the embedded graph) to the events of the
// CONVERGE_DOCS stream, and answers GET /v1/graph/{key}.
package main

import (
	"errors"
	"flag"
	"fmt"
	"os"

	"github.com/converge-sync/converge/internal/graph/backends"
)

func main() {
	if err := run(os.Args[1:]); err != nil {
		if errors.Is(err, flag.ErrHelp) {
			os.Exit(0)
		}
		fmt.Fprintln(os.Stderr, "projector-graph:", err)
		os.Exit(1)
	}
}

func run(args []string) error { return backends.Main(args) }
