package telemetry_test

import (
	"context"
	"os"
	"testing"

	"github.com/converge-sync/converge/internal/telemetry"
)

func TestTraceParentRoundTrip(t *testing.T) {
	const tp = "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01"
	ctx := telemetry.WithTraceParent(context.Background(), tp)
	if got := telemetry.TraceParent(ctx); got != tp {
		t.Fatalf("round trip: %q", got)
	}
	for _, bad := range []string{"", "nonsense", "00-00000000000000000000000000000000-00f067aa0ba902b7-01", "00-4bf92f3577b34da6a3ce929d0e0e4736-0000000000000000-01"} {
		if got := telemetry.TraceParent(telemetry.WithTraceParent(context.Background(), bad)); got != "" {
			t.Errorf("traceparent %q taken as %q", bad, got)
		}
	}
}

// Without an endpoint, tracing stays off and costs nothing; a protocol
// that is neither of the two is refused by name.
func TestStartTracingOffWithoutAnEndpoint(t *testing.T) {
	t.Setenv("OTEL_EXPORTER_OTLP_ENDPOINT", "")
	t.Setenv("OTEL_EXPORTER_OTLP_TRACES_ENDPOINT", "")
	os.Unsetenv("OTEL_EXPORTER_OTLP_ENDPOINT")
	os.Unsetenv("OTEL_EXPORTER_OTLP_TRACES_ENDPOINT")
	stop, err := telemetry.StartTracing(context.Background(), "converge-test", nil)
	if err != nil || telemetry.Tracing() || telemetry.TracingConfigured() {
		t.Fatalf("without an endpoint: %v, tracing %v", err, telemetry.Tracing())
	}
	if err := stop(context.Background()); err != nil {
		t.Fatal(err)
	}
	t.Setenv("OTEL_EXPORTER_OTLP_ENDPOINT", "http://127.0.0.1:1")
	t.Setenv("OTEL_EXPORTER_OTLP_PROTOCOL", "http/json")
	if _, err := telemetry.StartTracing(context.Background(), "converge-test", nil); err == nil || telemetry.Tracing() {
		t.Fatalf("protocol http/json: %v, tracing %v", err, telemetry.Tracing())
	}
}
