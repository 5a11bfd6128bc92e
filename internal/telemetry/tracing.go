package telemetry

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"os"
	"strings"
	"sync/atomic"
	"time"

	"go.opentelemetry.io/otel"
	"go.opentelemetry.io/otel/attribute"
	"go.opentelemetry.io/otel/exporters/otlp/otlptrace/otlptracegrpc"
	"go.opentelemetry.io/otel/exporters/otlp/otlptrace/otlptracehttp"
	"go.opentelemetry.io/otel/propagation"
	"go.opentelemetry.io/otel/sdk/resource"
	sdktrace "go.opentelemetry.io/otel/sdk/trace"
	"go.opentelemetry.io/otel/trace"
	"go.opentelemetry.io/otel/trace/noop"
)

// Traces follow one write through every hop, in W3C trace context: the
// writer takes a request's traceparent (or starts a trace) and stores it
// with the outbox row, the relay carries it as the message's traceparent
// header, and the projectors and the notifier continue it with a span per
// event they apply. They are exported over OTLP when
// OTEL_EXPORTER_OTLP_ENDPOINT (or OTEL_EXPORTER_OTLP_TRACES_ENDPOINT) is
// set, with OTEL_EXPORTER_OTLP_PROTOCOL http/protobuf (the default) or
// grpc and the exporters' other OTEL_ variables; without it no span is
// made, and a trace context that arrives is still passed on.

// Propagator reads and writes W3C traceparent and tracestate.
var Propagator propagation.TextMapPropagator = propagation.TraceContext{}

var tracing atomic.Bool

// Tracing reports whether spans are recorded and exported: the hot paths
// make none otherwise.
func Tracing() bool { return tracing.Load() }

// Tracer is converge's tracer of the component name, from the global
// provider as it is now (a no-op one unless [StartTracing] set it): taken
// at each span, not kept, since a tracer kept from before a provider was
// set again would stay with the one before.
func Tracer(name string) trace.Tracer {
	return otel.Tracer("github.com/converge-sync/converge/" + name)
}

// TracingConfigured reports whether the environment names an OTLP
// endpoint for traces.
func TracingConfigured() bool {
	return os.Getenv("OTEL_EXPORTER_OTLP_ENDPOINT") != "" || os.Getenv("OTEL_EXPORTER_OTLP_TRACES_ENDPOINT") != ""
}

// StartTracing sets the global tracer provider to one that exports the
// spans of service over OTLP, when the environment names an endpoint (see
// [TracingConfigured]); otherwise it does nothing. The returned function
// flushes and stops the exporter: call it on the way out.
func StartTracing(ctx context.Context, service string, log *slog.Logger) (shutdown func(context.Context) error, err error) {
	otel.SetTextMapPropagator(Propagator)
	if log == nil {
		log = slog.New(slog.DiscardHandler)
	}
	if !TracingConfigured() || strings.EqualFold(os.Getenv("OTEL_SDK_DISABLED"), "true") {
		return func(context.Context) error { return nil }, nil
	}
	var exp sdktrace.SpanExporter
	protocol := os.Getenv("OTEL_EXPORTER_OTLP_TRACES_PROTOCOL")
	if protocol == "" {
		protocol = os.Getenv("OTEL_EXPORTER_OTLP_PROTOCOL")
	}
	switch protocol {
	case "", "http/protobuf":
		exp, err = otlptracehttp.New(ctx)
	case "grpc":
		exp, err = otlptracegrpc.New(ctx)
	default:
		return nil, fmt.Errorf("telemetry: OTEL_EXPORTER_OTLP_PROTOCOL %q is not one of http/protobuf and grpc", protocol)
	}
	if err != nil {
		return nil, fmt.Errorf("telemetry: the OTLP trace exporter: %w", err)
	}
	res, err := resource.Merge(resource.Default(), resource.NewSchemaless(attribute.String("service.name", service)))
	if err != nil {
		// OTEL_RESOURCE_ATTRIBUTES may name a schema of its own; the
		// service's name is what matters.
		res = resource.NewSchemaless(attribute.String("service.name", service))
	}
	tp := sdktrace.NewTracerProvider(sdktrace.WithBatcher(exp, sdktrace.WithBatchTimeout(time.Second)), sdktrace.WithResource(res))
	otel.SetTracerProvider(tp)
	otel.SetErrorHandler(otel.ErrorHandlerFunc(func(err error) {
		log.Warn("exporting traces failed", "err", err)
	}))
	tracing.Store(true)
	log.Info("exporting traces over OTLP", "service", service, "protocol", strings.TrimSpace(protocol+" (default http/protobuf)"))
	return func(ctx context.Context) error {
		tracing.Store(false)
		otel.SetTracerProvider(noop.NewTracerProvider())
		err := tp.Shutdown(ctx)
		if errors.Is(err, context.DeadlineExceeded) {
			return fmt.Errorf("telemetry: flushing the last spans: %w", err)
		}
		return err
	}, nil
}

// Carrier is a trace context as a text map: traceparent, and tracestate
// when there is one.
type Carrier map[string]string

// Get implements propagation.TextMapCarrier.
func (c Carrier) Get(key string) string { return c[key] }

// Set implements propagation.TextMapCarrier.
func (c Carrier) Set(key, value string) { c[key] = value }

// Keys implements propagation.TextMapCarrier.
func (c Carrier) Keys() []string {
	out := make([]string, 0, len(c))
	for k := range c {
		out = append(out, k)
	}
	return out
}

// TraceParent is the traceparent of ctx's span context ("" when ctx
// carries none): what a hop stores or sends to continue the trace.
func TraceParent(ctx context.Context) string {
	if !trace.SpanContextFromContext(ctx).IsValid() {
		return ""
	}
	c := Carrier{}
	Propagator.Inject(ctx, c)
	return c["traceparent"]
}

// WithTraceParent returns ctx carrying the remote span context of
// traceparent; ctx itself when traceparent is empty or malformed.
func WithTraceParent(ctx context.Context, traceparent string) context.Context {
	if traceparent == "" {
		return ctx
	}
	return Propagator.Extract(ctx, Carrier{"traceparent": traceparent})
}
