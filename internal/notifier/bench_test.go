package notifier

import "testing"

// The per-request work of the hot path: the body and its signature.
func BenchmarkEncodeAndSign(b *testing.B) {
	ev := upsert("docs/benchmark", 42)
	effect := EffectID("https://receiver.example/hooks/converge", ev.ID)
	b.ReportAllocs()
	for b.Loop() {
		body, err := encodeNotification(effect, &ev)
		if err != nil {
			b.Fatal(err)
		}
		_ = Sign(testSecret, "1700000000", body)
	}
}
