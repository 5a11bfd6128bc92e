package writer

import (
	"bufio"
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"mime"
	"net/http"
	"slices"
	"strconv"
	"strings"
	"time"

	"github.com/google/uuid"
	"go.opentelemetry.io/otel/attribute"
	"go.opentelemetry.io/otel/codes"
	"go.opentelemetry.io/otel/propagation"
	"go.opentelemetry.io/otel/trace"

	"github.com/converge-sync/converge/api"
	"github.com/converge-sync/converge/internal/auth"
	"github.com/converge-sync/converge/internal/docstore"
	"github.com/converge-sync/converge/internal/httpjson"
	"github.com/converge-sync/converge/internal/telemetry"
	"github.com/converge-sync/converge/pkg/contract"
)

// Store is what the API and the ingest consumer need of the document store.
type Store interface {
	Apply(ctx context.Context, writes []docstore.Write) ([]docstore.Outcome, error)
	Get(ctx context.Context, key string) (docstore.Record, error)
	Reemit(ctx context.Context, keys []string) (docstore.Reemitted, error)
	ReemitAll(ctx context.Context, after string, limit int) (docstore.Reemitted, string, error)
}

// APIConfig of the HTTP API.
type APIConfig struct {
	// BatchSize is how many NDJSON lines go into one transaction.
	// Default 500.
	BatchSize int
	// Guard checks each request's bearer token: the document routes need
	// the write scope (reading one back, read or write), re-emission the
	// admin scope. Nil serves every request.
	Guard *auth.Guard
}

// DefaultAPIBatchSize is the default of APIConfig.BatchSize, and of
// -batch-size.
const DefaultAPIBatchSize = 500

func (c *APIConfig) setDefaults() {
	if c.BatchSize <= 0 {
		c.BatchSize = DefaultAPIBatchSize
	}
}

// API serves the writer's HTTP routes.
type API struct {
	store   Store
	cfg     APIConfig
	metrics *Metrics
	log     *slog.Logger
	mux     *http.ServeMux
}

// NewAPI returns the HTTP API over store.
func NewAPI(store Store, cfg APIConfig, metrics *Metrics, log *slog.Logger) *API {
	cfg.setDefaults()
	if metrics == nil {
		metrics = NewMetrics(nil)
	}
	if log == nil {
		log = slog.New(slog.DiscardHandler)
	}
	a := &API{store: store, cfg: cfg, metrics: metrics, log: log, mux: http.NewServeMux()}
	for _, rt := range a.routes() {
		a.mux.HandleFunc(rt.pattern, a.instrument(rt.name, rt.handler))
	}
	return a
}

type route struct {
	pattern string // method and path, as http.ServeMux reads them
	name    string // the route label of the metrics
	handler http.HandlerFunc
}

// routes are the API's routes; api/openapi.json describes each of them.
func (a *API) routes() []route {
	return []route{
		{"PUT /v1/documents/{key...}", "put", a.require(auth.Write, a.put)},
		{"DELETE /v1/documents/{key...}", "delete", a.require(auth.Write, a.withdraw)},
		{"GET /v1/documents/{key...}", "get", a.require(auth.Read|auth.Write, a.get)},
		{"POST /v1/documents:batch", "batch", a.require(auth.Write, a.batch)},
		{"POST /v1/admin/reemit", "reemit", a.require(auth.Admin, a.reemit)},
		// The description is public: it holds no data, and clients are
		// generated from it before they have a token.
		{"GET /openapi.json", "openapi", serveOpenAPI},
	}
}

// Routes lists the patterns the API serves ("METHOD /path", a {name...}
// wildcard taking the rest of the path).
func (a *API) Routes() []string {
	var out []string
	for _, rt := range a.routes() {
		out = append(out, rt.pattern)
	}
	return out
}

func serveOpenAPI(w http.ResponseWriter, _ *http.Request) {
	w.Header().Set("Content-Type", "application/json")
	w.Header().Set("Cache-Control", "no-cache")
	_, _ = w.Write(api.OpenAPI)
}

// require serves h to the requests whose token holds scope. Inside
// instrument, so that refusals are counted with their status.
func (a *API) require(scope auth.Scope, h http.HandlerFunc) http.HandlerFunc {
	return a.cfg.Guard.Require(scope, h).ServeHTTP
}

func (a *API) ServeHTTP(w http.ResponseWriter, r *http.Request) { a.mux.ServeHTTP(w, r) }

type statusRecorder struct {
	http.ResponseWriter
	code int
}

func (s *statusRecorder) WriteHeader(code int) {
	if s.code == 0 {
		s.code = code
	}
	s.ResponseWriter.WriteHeader(code)
}

// Unwrap lets http.ResponseController reach the connection (full duplex).
func (s *statusRecorder) Unwrap() http.ResponseWriter { return s.ResponseWriter }

func (s *statusRecorder) Flush() {
	if f, ok := s.ResponseWriter.(http.Flusher); ok {
		f.Flush()
	}
}

// instrument counts each request of route by status and, with tracing on,
// makes it a span: of the trace its traceparent names, or of a new one.
// Without tracing a traceparent is still taken, so that the outbox row
// carries it on.
func (a *API) instrument(route string, h http.HandlerFunc) http.HandlerFunc {
	return func(w http.ResponseWriter, r *http.Request) {
		ctx := r.Context()
		if r.Header.Get("traceparent") != "" {
			ctx = telemetry.Propagator.Extract(ctx, propagation.HeaderCarrier(r.Header))
		}
		var span trace.Span
		if telemetry.Tracing() {
			ctx, span = tracer().Start(ctx, strings.ReplaceAll(r.Pattern, "...}", "}"),
				trace.WithSpanKind(trace.SpanKindServer),
				trace.WithAttributes(attribute.String("http.request.method", r.Method), attribute.String("http.route", route)))
		}
		if ctx != r.Context() {
			r = r.WithContext(ctx)
		}
		rec := &statusRecorder{ResponseWriter: w}
		h(rec, r)
		if rec.code == 0 {
			rec.code = http.StatusOK
		}
		a.metrics.Requests.WithLabelValues(route, strconv.Itoa(rec.code)).Inc()
		if span != nil {
			span.SetAttributes(attribute.Int("http.response.status_code", rec.code))
			if rec.code >= 500 {
				span.SetStatus(codes.Error, http.StatusText(rec.code))
			}
			span.End()
		}
	}
}

// tracer is the current provider's: spans are made only with tracing on.
func tracer() trace.Tracer { return telemetry.Tracer("writer") }

// WriteResult is the answer to a PUT or DELETE, and one line of a batch.
type WriteResult struct {
	Line    int        `json:"line,omitempty"`
	Key     string     `json:"key"`
	Version int64      `json:"version"`
	Result  string     `json:"result,omitempty"`
	EventID *uuid.UUID `json:"event_id,omitempty"`
	Error   *ErrorBody `json:"error,omitempty"`
}

// ErrorBody is the body of every error: {"error":{"code","message"}}.
type ErrorBody = httpjson.ErrorBody

func writeJSON(w http.ResponseWriter, status int, v any) { httpjson.Write(w, status, v) }

func writeError(w http.ResponseWriter, status int, code, message string) {
	httpjson.Error(w, status, code, message)
}

// errorStatus maps an error to its HTTP status and code.
func errorStatus(err error) (int, string) {
	var ve *contract.ValidationError
	switch {
	case errors.As(err, &ve):
		switch {
		case ve.Code == "request_too_large" || ve.TooLarge():
			return http.StatusRequestEntityTooLarge, ve.Code
		case ve.Code == contract.CodeInvalidJSON || ve.Code == contract.CodeInvalidUTF8:
			return http.StatusBadRequest, ve.Code
		default:
			return http.StatusUnprocessableEntity, ve.Code
		}
	case isConflict(err):
		return http.StatusConflict, "version_conflict"
	case permanent(err):
		return http.StatusUnprocessableEntity, "rejected_value"
	case errors.Is(err, docstore.ErrNotFound):
		return http.StatusNotFound, "not_found"
	case errors.Is(err, docstore.ErrNotReproducible):
		return http.StatusInternalServerError, "not_reproducible"
	case errors.Is(err, context.Canceled), errors.Is(err, context.DeadlineExceeded):
		return http.StatusServiceUnavailable, "unavailable"
	default:
		return http.StatusServiceUnavailable, "store_unavailable"
	}
}

func isConflict(err error) bool { return errors.Is(err, docstore.ErrVersionConflict) }

func (a *API) fail(w http.ResponseWriter, r *http.Request, err error) {
	status, code := errorStatus(err)
	msg := err.Error()
	if code == "not_reproducible" {
		msg = notReproducibleMessage(err)
	}
	if status == http.StatusServiceUnavailable {
		a.log.ErrorContext(r.Context(), "write failed", "method", r.Method, "path", r.URL.Path, "err", err)
		msg = "the document store is unavailable; nothing was written, retry later"
	}
	writeError(w, status, code, msg)
}

func requireContentType(r *http.Request, allowed ...string) error {
	ct := r.Header.Get("Content-Type")
	mt, _, err := mime.ParseMediaType(ct)
	if err == nil {
		for _, a := range allowed {
			if mt == a {
				return nil
			}
		}
	}
	return fmt.Errorf("Content-Type must be %s, got %q", allowed[0], ct)
}

// readBody reads at most limit bytes; more is a 413.
func readBody(w http.ResponseWriter, r *http.Request, limit int64) ([]byte, error) {
	data, err := io.ReadAll(http.MaxBytesReader(w, r.Body, limit))
	var mbe *http.MaxBytesError
	if errors.As(err, &mbe) {
		return nil, &contract.ValidationError{Code: "request_too_large",
			Message: fmt.Sprintf("request body is larger than the limit of %d bytes", limit)}
	}
	if err != nil {
		return nil, invalid(contract.CodeInvalidJSON, "reading the request body: %v", err)
	}
	return data, nil
}

func (a *API) pathKey(w http.ResponseWriter, r *http.Request) (string, bool) {
	key := r.PathValue("key")
	if err := contract.ValidateKey(key); err != nil {
		status, code := errorStatus(err)
		writeError(w, status, code, err.Error())
		return "", false
	}
	return key, true
}

func (a *API) put(w http.ResponseWriter, r *http.Request) {
	if err := requireContentType(r, "application/json"); err != nil {
		writeError(w, http.StatusUnsupportedMediaType, "unsupported_media_type", err.Error())
		return
	}
	key, ok := a.pathKey(w, r)
	if !ok {
		return
	}
	data, err := readBody(w, r, MaxRequestBytes)
	if err != nil {
		a.fail(w, r, err)
		return
	}
	wr, err := decodeWrite(data, key, false)
	if err != nil {
		a.metrics.Documents.WithLabelValues("http", "invalid").Inc()
		a.fail(w, r, err)
		return
	}
	wr.TraceParent = telemetry.TraceParent(r.Context())
	a.applyOne(w, r, wr)
}

func (a *API) withdraw(w http.ResponseWriter, r *http.Request) {
	key, ok := a.pathKey(w, r)
	if !ok {
		return
	}
	version, err := parseVersionText(r.URL.Query().Get("version"))
	if err != nil {
		a.fail(w, r, err)
		return
	}
	a.applyOne(w, r, docstore.Write{Doc: contract.Document{Key: key, Version: version}, Withdraw: true,
		TraceParent: telemetry.TraceParent(r.Context())})
}

func (a *API) applyOne(w http.ResponseWriter, r *http.Request, wr docstore.Write) {
	start := time.Now()
	outs, err := applyIsolating(r.Context(), a.store, []docstore.Write{wr})
	a.metrics.TxSeconds.WithLabelValues("single").Observe(time.Since(start).Seconds())
	if err != nil {
		a.fail(w, r, err)
		return
	}
	a.metrics.count("http", outs)
	o := outs[0]
	if o.Err != nil {
		a.fail(w, r, o.Err)
		return
	}
	id := o.EventID
	writeJSON(w, http.StatusOK, WriteResult{Key: o.Key, Version: o.Version, Result: string(o.Result), EventID: &id})
}

func (a *API) get(w http.ResponseWriter, r *http.Request) {
	key, ok := a.pathKey(w, r)
	if !ok {
		return
	}
	rec, err := a.store.Get(r.Context(), key)
	if err != nil {
		a.fail(w, r, err)
		return
	}
	writeJSON(w, http.StatusOK, rec)
}

// batch reads NDJSON, one document per line, stores them BatchSize lines per
// transaction and streams one result line per non-blank input line. A bad
// line is answered with its error and does not affect the others. If the
// store fails, the lines of the failed transaction are answered with
// store_unavailable and the request ends there: nothing of that
// transaction was written, and later lines were not read.
func (a *API) batch(w http.ResponseWriter, r *http.Request) {
	if err := requireContentType(r, "application/x-ndjson", "application/ndjson", "application/jsonl"); err != nil {
		writeError(w, http.StatusUnsupportedMediaType, "unsupported_media_type", err.Error())
		return
	}
	// Results stream back while the body is still being read. Without full
	// duplex, net/http would discard the unread body once the first results
	// are flushed, and the remaining lines would be lost.
	if err := http.NewResponseController(w).EnableFullDuplex(); err != nil {
		a.log.WarnContext(r.Context(), "full duplex unavailable: large batches may lose lines", "err", err)
	}
	// A handler that returns with the body unread (the store failed) must
	// close it in full duplex, or net/http reads the connection for the
	// next request while the body's reader still may (golang/go#68560,
	// "invalid concurrent Body.Read call").
	defer r.Body.Close()
	w.Header().Set("Content-Type", "application/x-ndjson")
	w.WriteHeader(http.StatusOK)
	out := bufio.NewWriter(w)
	enc := json.NewEncoder(out)
	enc.SetEscapeHTML(false)
	flusher, _ := w.(http.Flusher)

	in := bufio.NewReaderSize(r.Body, 64<<10)
	traceParent := telemetry.TraceParent(r.Context()) // every line's
	var (
		writes  []docstore.Write
		lines   []int
		results []WriteResult // decoded-line failures waiting for their turn, in order
		lineNo  int
		eof     bool
	)
	flush := func() bool {
		ok := true
		if len(writes) > 0 {
			start := time.Now()
			outs, err := applyIsolating(r.Context(), a.store, writes)
			a.metrics.TxSeconds.WithLabelValues("batch").Observe(time.Since(start).Seconds())
			if err != nil {
				ok = false
				_, code := errorStatus(err)
				a.log.ErrorContext(r.Context(), "batch write failed", "lines", len(writes), "err", err)
				for i := range writes {
					results = append(results, WriteResult{Line: lines[i], Key: writes[i].Doc.Key, Version: writes[i].Doc.Version,
						Error: &ErrorBody{Code: code, Message: "the document store is unavailable; nothing of this transaction was written"}})
				}
			} else {
				a.metrics.count("batch", outs)
				for i, o := range outs {
					results = append(results, resultLine(lines[i], o))
				}
			}
		}
		slices.SortStableFunc(results, func(a, b WriteResult) int { return a.Line - b.Line })
		for _, res := range results {
			_ = enc.Encode(res)
		}
		_ = out.Flush()
		if flusher != nil {
			flusher.Flush()
		}
		writes, lines, results = writes[:0], lines[:0], results[:0]
		return ok
	}
	for !eof {
		line, err := readLine(in, MaxRequestBytes)
		switch {
		case errors.Is(err, io.EOF):
			eof = true
			if len(bytes.TrimSpace(line)) == 0 {
				continue
			}
		case errors.Is(err, errLineTooLong):
			lineNo++
			results = append(results, WriteResult{Line: lineNo, Error: &ErrorBody{Code: "request_too_large",
				Message: fmt.Sprintf("line is longer than the limit of %d bytes", MaxRequestBytes)}})
			if len(writes) == 0 {
				flush()
			}
			continue
		case err != nil:
			// The client went away or the body broke: answer what we have.
			eof = true
			if len(bytes.TrimSpace(line)) == 0 {
				continue
			}
		}
		lineNo++
		if len(bytes.TrimSpace(line)) == 0 {
			continue
		}
		wr, derr := decodeWrite(line, "", true)
		if derr != nil {
			a.metrics.Documents.WithLabelValues("batch", "invalid").Inc()
			_, code := errorStatus(derr)
			results = append(results, WriteResult{Line: lineNo, Key: keyOf(wr, line), Error: &ErrorBody{Code: code, Message: derr.Error()}})
			if len(writes) == 0 {
				flush() // nothing pending: answer it now, keep the stream moving
			}
			continue
		}
		wr.TraceParent = traceParent
		writes = append(writes, wr)
		lines = append(lines, lineNo)
		if len(writes) >= a.cfg.BatchSize {
			if !flush() {
				return
			}
		}
	}
	flush()
}

func resultLine(line int, o docstore.Outcome) WriteResult {
	res := WriteResult{Line: line, Key: o.Key, Version: o.Version}
	if o.Err != nil {
		_, code := errorStatus(o.Err)
		res.Error = &ErrorBody{Code: code, Message: o.Err.Error()}
		return res
	}
	id := o.EventID
	res.Result, res.EventID = string(o.Result), &id
	return res
}

// keyOf recovers the key of a line that failed to decode, when it can, so
// the result line names the document.
func keyOf(wr docstore.Write, line []byte) string {
	if wr.Doc.Key != "" {
		return wr.Doc.Key
	}
	var probe struct {
		Key string `json:"key"`
	}
	_ = json.Unmarshal(line, &probe)
	return probe.Key
}

var errLineTooLong = errors.New("line too long")

// readLine reads one line without its newline. A line over limit is
// consumed to its end and reported as errLineTooLong.
func readLine(r *bufio.Reader, limit int) ([]byte, error) {
	var buf []byte
	for {
		part, err := r.ReadSlice('\n')
		if len(buf)+len(part) > limit {
			for errors.Is(err, bufio.ErrBufferFull) {
				_, err = r.ReadSlice('\n')
			}
			if err != nil && !errors.Is(err, io.EOF) {
				return nil, err
			}
			return nil, errLineTooLong
		}
		buf = append(buf, part...)
		if errors.Is(err, bufio.ErrBufferFull) {
			continue
		}
		if err != nil {
			return buf, err
		}
		return bytes.TrimSuffix(bytes.TrimSuffix(buf, []byte("\n")), []byte("\r")), nil
	}
}
