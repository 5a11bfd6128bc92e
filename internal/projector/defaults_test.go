package projector

import (
	"testing"

	"github.com/converge-sync/converge/internal/config"
)

// The flags' defaults are a zero Config's: a projector started by its
// binary and one made in code run alike.
func TestFlagDefaultsAreTheConfigDefaults(t *testing.T) {
	f := config.NewFlagsIn("projector-index", func(string) (string, bool) { return "", false })
	get := ServiceFlags(f, "index", "127.0.0.1:0")
	if err := f.Parse([]string{"-nats-url", "nats://127.0.0.1:4222"}); err != nil {
		t.Fatal(err)
	}
	sc, err := get()
	if err != nil {
		t.Fatal(err)
	}
	flags := sc.Runtime
	zero := Config{Name: "index"}
	if err := zero.setDefaults(); err != nil {
		t.Fatal(err)
	}
	if flags.BatchSize != zero.BatchSize || flags.Parallel != zero.Parallel || flags.AckWait != zero.AckWait ||
		flags.MaxDeliver != zero.MaxDeliver {
		t.Fatalf("flags' defaults: batch %d, parallel %d, ack wait %v, max deliver %d; a zero Config's: %d, %d, %v, %d",
			flags.BatchSize, flags.Parallel, flags.AckWait, flags.MaxDeliver, zero.BatchSize, zero.Parallel, zero.AckWait, zero.MaxDeliver)
	}
}
