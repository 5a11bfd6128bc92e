// Command projector-index is the single writer of the index: it converges
// a Qdrant collection (or the embedded index) to the events of the
// CONVERGE_DOCS stream, and answers searches on GET /v1/search.
package main

import (
	"github.com/converge-sync/converge/internal/indexprojector"
	"github.com/converge-sync/converge/internal/service"
)

func main() { service.Main("projector-index", indexprojector.ServiceFlags, indexprojector.Run) }
