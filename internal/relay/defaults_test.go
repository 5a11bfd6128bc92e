package relay

import (
	"testing"

	"github.com/converge-sync/converge/internal/config"
)

// TestFlagDefaultsAreConfigDefaults checks that the relay's flags, given
// no value and no variable, give the settings a zero Config takes.
func TestFlagDefaultsAreConfigDefaults(t *testing.T) {
	f := config.NewFlagsIn("relay", func(string) (string, bool) { return "", false })
	take := Flags(f)
	if err := f.Parse([]string{"-postgres-url", "x", "-nats-url", "y"}); err != nil {
		t.Fatal(err)
	}
	sc, err := take()
	if err != nil {
		t.Fatal(err)
	}
	got := sc.Relay
	var want Config
	want.setDefaults()
	for _, c := range []struct {
		flag      string
		got, want any
	}{
		{"slot", got.Slot, want.Slot},
		{"window", got.Window, want.Window},
		{"window-bytes", got.WindowBytes, want.WindowBytes},
		{"ack-timeout", got.AckTimeout, want.AckTimeout},
		{"heartbeat", got.HeartbeatInterval, want.HeartbeatInterval},
		{"standby-retry", got.StandbyRetry, want.StandbyRetry},
		{"lag-alarm-bytes", got.LagAlarmBytes, want.LagAlarmBytes},
		{"stream-storage", got.Stream.Storage, want.Stream.Storage},
		{"replicas", got.Stream.Replicas, want.Stream.Replicas},
		{"stream-duplicates", got.Stream.Duplicates, want.Stream.Duplicates},
		{"stream-history", got.Stream.MaxMsgsPerSubject, want.Stream.MaxMsgsPerSubject},
		{"effects", got.Effects.Enabled, want.Effects.Enabled},
		{"effects-max-age", got.Effects.MaxAge, want.Effects.MaxAge},
		{"effects-max-bytes", got.Effects.MaxBytes, want.Effects.MaxBytes},
	} {
		if c.got != c.want {
			t.Errorf("-%s defaults to %v, a zero Config to %v", c.flag, c.got, c.want)
		}
	}
}
