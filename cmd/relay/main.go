// Command relay streams the outbox from Postgres to JetStream: the only
// publisher of the CONVERGE_DOCS stream. Run two for availability: the
// second waits as a standby until the first goes away.
package main

import (
	"github.com/converge-sync/converge/internal/relay"
	"github.com/converge-sync/converge/internal/service"
)

func main() { service.Main("relay", relay.Flags, relay.Run) }
