// Command projector-graph is the single writer of the graph: it converges
// a Neo4j database (or the embedded graph) to the events of the
// CONVERGE_DOCS stream, and answers GET /v1/graph/{key}.
package main

import (
	"github.com/converge-sync/converge/internal/graphprojector"
	"github.com/converge-sync/converge/internal/service"
)

func main() { service.Main("projector-graph", graphprojector.ServiceFlags, graphprojector.Run) }
