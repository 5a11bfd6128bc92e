// Command notifier is the one non-idempotent effect of converge: it POSTs
// a signed JSON notification to each configured webhook URL when a
// document version is upserted or withdrawn, at most once per effect id
// within its dedup window (see package notifier).
package main

import (
	"github.com/converge-sync/converge/internal/notifier"
	"github.com/converge-sync/converge/internal/service"
)

func main() { service.Main("notifier", notifier.ServiceFlags, notifier.Run) }
