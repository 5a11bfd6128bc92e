// Package migrations holds converge's Postgres schema as golang-migrate SQL
// files, embedded into the binaries so that `converge migrate up` needs no
// files on disk.
package migrations

import "embed"

// FS holds the numbered *.up.sql and *.down.sql files.
//
//go:embed *.sql
var FS embed.FS
