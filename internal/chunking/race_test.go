//go:build race

package chunking

const raceEnabled = true
