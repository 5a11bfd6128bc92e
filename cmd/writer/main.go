// Command writer is converge's only writer of Postgres: it serves the
// document HTTP API and, when a NATS URL is given, consumes documents from
// converge.ingest.>.
package main

import (
	"github.com/converge-sync/converge/internal/service"
	"github.com/converge-sync/converge/internal/writer"
)

func main() { service.Main("writer", writer.Flags, writer.Run) }
