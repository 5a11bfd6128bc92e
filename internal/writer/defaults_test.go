package writer

import (
	"testing"

	"github.com/converge-sync/converge/internal/config"
)

// TestFlagDefaultsAreConfigDefaults checks that the writer's flags, given
// no value and no variable, give the settings a zero ServiceConfig takes.
func TestFlagDefaultsAreConfigDefaults(t *testing.T) {
	f := config.NewFlagsIn("writer", func(string) (string, bool) { return "", false })
	take := Flags(f)
	if err := f.Parse([]string{"-postgres-url", "x"}); err != nil {
		t.Fatal(err)
	}
	got, err := take()
	if err != nil {
		t.Fatal(err)
	}
	want := ServiceConfig{}.withDefaults()
	want.API.setDefaults()
	want.Ingest.setDefaults()
	want.Retention.setDefaults()
	for _, c := range []struct {
		flag      string
		got, want any
	}{
		{"max-conns", got.MaxConns, want.MaxConns},
		// -shutdown-grace defaults to 0, which Run takes for the default.
		{"shutdown-grace", got.withDefaults().ShutdownGrace, want.ShutdownGrace},
		{"batch-size", got.API.BatchSize, want.API.BatchSize},
		{"ack-wait", got.Ingest.AckWait, want.Ingest.AckWait},
		{"replicas", got.Ingest.Replicas, want.Ingest.Replicas},
		{"outbox-retention", got.Retention.Retention, want.Retention.Retention},
	} {
		if c.got != c.want {
			t.Errorf("-%s defaults to %v, a zero ServiceConfig to %v", c.flag, c.got, c.want)
		}
	}
}
