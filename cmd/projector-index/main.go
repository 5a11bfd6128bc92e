// Command projector-index is the single writer of the index: it converges
// a Qdrant collection (or the embedded index) to the events of the
// CONVERGE_DOCS stream, and answers searches on GET /v1/search.
package main

import (
	"github.com/converge-sync/converge/internal/index/backends"
	"github.com/converge-sync/converge/internal/service"
)

func main() { service.Main("projector-index", backends.ServiceFlags, backends.Run) }
