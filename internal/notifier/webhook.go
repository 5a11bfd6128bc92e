package notifier

import (
	"bytes"
	"context"
	"crypto/hmac"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net/http"
	"net/url"
	"strconv"
	"strings"
	"time"

	"github.com/google/uuid"
	"go.opentelemetry.io/otel/attribute"
	"go.opentelemetry.io/otel/codes"
	"go.opentelemetry.io/otel/trace"

	"github.com/converge-sync/converge/internal/telemetry"
	"github.com/converge-sync/converge/pkg/contract"
)

// Headers of a notification request.
const (
	HeaderIdempotencyKey = "Idempotency-Key"    // the effect id; the same on every attempt
	HeaderTimestamp      = "Converge-Timestamp" // Unix seconds of this attempt
	HeaderSignature      = "Converge-Signature" // "sha256=" + hex HMAC of timestamp + "." + body
	HeaderEventID        = "Converge-Event-Id"  // the event id
	HeaderAttempt        = "Converge-Attempt"   // 1 for the first attempt of the effect
)

// NotificationSchema names the body's format.
const NotificationSchema = "converge.notification.v1"

// Notification is the JSON body of a request. It is a pure function of the
// effect and its event, so every attempt of one effect sends the same bytes.
type Notification struct {
	Schema      string        `json:"schema"`
	EffectID    uuid.UUID     `json:"effect_id"`
	EventID     uuid.UUID     `json:"event_id"`
	Kind        contract.Kind `json:"kind"`
	Key         string        `json:"key"`
	Version     int64         `json:"version"`
	Withdrawn   bool          `json:"withdrawn"`
	Title       string        `json:"title,omitempty"`
	ContentHash string        `json:"content_hash"`
	Chunks      int           `json:"chunks"`
}

// NewNotification is the notification of the effect on ev.
func NewNotification(effect uuid.UUID, ev *contract.Event) Notification {
	return Notification{Schema: NotificationSchema, EffectID: effect, EventID: ev.ID, Kind: ev.Kind, Key: ev.Key,
		Version: ev.Version, Withdrawn: ev.Kind == contract.KindWithdrawn, Title: ev.Title, ContentHash: ev.ContentHash,
		Chunks: len(ev.Chunks)}
}

// Sign is the value of the Converge-Signature header of body sent at
// timestamp (the Converge-Timestamp header's value): "sha256=" and the
// lowercase hex of HMAC-SHA256(secret, timestamp + "." + body).
func Sign(secret []byte, timestamp string, body []byte) string {
	mac := hmac.New(sha256.New, secret)
	mac.Write([]byte(timestamp))
	mac.Write([]byte{'.'})
	mac.Write(body)
	return "sha256=" + hex.EncodeToString(mac.Sum(nil))
}

// Errors of [Verify].
var (
	ErrBadSignature = errors.New("notifier: signature does not match")
	ErrStale        = errors.New("notifier: timestamp outside the tolerance")
)

// Verify checks a received notification as a receiver should: the
// signature (in constant time) and, with tolerance > 0, that the timestamp
// is within tolerance of now, which stops an old request from being
// replayed by someone who captured it.
func Verify(secret []byte, timestamp, signature string, body []byte, tolerance time.Duration, now time.Time) error {
	if !hmac.Equal([]byte(Sign(secret, timestamp, body)), []byte(signature)) {
		return ErrBadSignature
	}
	if tolerance > 0 {
		sec, err := strconv.ParseInt(timestamp, 10, 64)
		if err != nil {
			return fmt.Errorf("%w: %q is not Unix seconds", ErrStale, timestamp)
		}
		if d := now.Sub(time.Unix(sec, 0)); d > tolerance || d < -tolerance {
			return ErrStale
		}
	}
	return nil
}

// excerptBytes is how much of a failed answer's body is kept.
const excerptBytes = 512

// drainBytes is how much more of an answer is read so that the connection
// can be reused.
const drainBytes = 64 << 10

// sendError is a failed attempt: a non-2xx answer (Status > 0) or no
// answer at all (Err: a timeout, a refused connection).
type sendError struct {
	Target  string // the target's public name
	Status  int
	Excerpt string // with the URL's hidden parts hidden
	Err     error
	// hidden are the parts of the target's URL that its message must not
	// quote: Err's text is the transport's, which may.
	hidden []string
}

func (e *sendError) Error() string {
	if e.Status == 0 {
		return fmt.Sprintf("webhook %s: %s", e.Target, hide(e.Err.Error(), e.hidden))
	}
	s := fmt.Sprintf("webhook %s: HTTP %d", e.Target, e.Status)
	if e.Excerpt != "" {
		s += ": " + strconv.Quote(e.Excerpt)
	}
	return s
}

func (e *sendError) Unwrap() error { return e.Err }

// post sends one attempt of an effect; it returns nil on a 2xx answer.
// tracer is the current provider's: spans are made only with tracing on.
func tracer() trace.Tracer { return telemetry.Tracer("notifier") }

func (n *Notifier) post(ctx context.Context, t *target, effect uuid.UUID, ev *contract.Event, body []byte, attempt int) error {
	ctx, cancel := context.WithTimeout(ctx, n.cfg.HTTPTimeout)
	defer cancel()
	req, err := http.NewRequestWithContext(ctx, http.MethodPost, t.url, bytes.NewReader(body))
	if err != nil {
		return &sendError{Target: t.name, Err: withoutURL(err), hidden: t.hidden}
	}
	ts := strconv.FormatInt(n.cfg.Clock.Now().Unix(), 10)
	req.Header.Set("Content-Type", "application/json")
	req.Header.Set("User-Agent", "converge-notifier")
	req.Header.Set(HeaderIdempotencyKey, effect.String())
	req.Header.Set(HeaderTimestamp, ts)
	req.Header.Set(HeaderSignature, Sign(n.cfg.Secret, ts, body))
	req.Header.Set(HeaderEventID, ev.ID.String())
	req.Header.Set(HeaderAttempt, strconv.Itoa(attempt))
	// The receiver may continue the trace of the write that made the event:
	// from a span of this request, with tracing on.
	var span trace.Span
	if telemetry.Tracing() && trace.SpanContextFromContext(ctx).IsValid() {
		ctx, span = tracer().Start(ctx, "webhook POST", trace.WithSpanKind(trace.SpanKindClient),
			trace.WithAttributes(attribute.String("converge.target", t.name), attribute.String("converge.key", ev.Key),
				attribute.Int64("converge.version", ev.Version), attribute.Int("converge.attempt", attempt)))
		defer span.End()
	}
	if tp := telemetry.TraceParent(ctx); tp != "" {
		req.Header.Set("traceparent", tp)
	}
	start := time.Now()
	resp, err := n.client.Do(req)
	n.metrics.RequestSeconds.WithLabelValues(t.name).Observe(time.Since(start).Seconds())
	if span != nil {
		if err != nil {
			span.SetStatus(codes.Error, "no answer")
		} else {
			span.SetAttributes(attribute.Int("http.response.status_code", resp.StatusCode))
			if resp.StatusCode >= 300 {
				span.SetStatus(codes.Error, http.StatusText(resp.StatusCode))
			}
		}
	}
	if err != nil {
		err = withoutURL(err)
		if errors.Is(err, context.DeadlineExceeded) {
			err = fmt.Errorf("no answer within %v: %w", n.cfg.HTTPTimeout, err)
		}
		return &sendError{Target: t.name, Err: err, hidden: t.hidden}
	}
	defer func() { _ = resp.Body.Close() }()
	head, _ := io.ReadAll(io.LimitReader(resp.Body, excerptBytes))
	_, _ = io.CopyN(io.Discard, resp.Body, drainBytes)
	if resp.StatusCode >= 200 && resp.StatusCode < 300 {
		return nil
	}
	return &sendError{Target: t.name, Status: resp.StatusCode, Excerpt: excerpt(head, t.hidden),
		Err: fmt.Errorf("HTTP %d", resp.StatusCode), hidden: t.hidden}
}

// withoutURL is err without the *url.Error around it, whose message
// quotes the whole URL, credentials included; the cause is kept.
func withoutURL(err error) error {
	for {
		ue, ok := err.(*url.Error) //nolint:errorlint // only an outer *url.Error is removed: its cause is what is kept
		if !ok {
			return err
		}
		err = ue.Err
	}
}

// excerpt makes a body prefix printable: valid UTF-8, trimmed, without
// the parts of the URL that are hidden (a receiver may quote the path of
// the request, as many frameworks' "not found" pages do), nor what is left
// of one that the prefix cuts off.
func excerpt(b []byte, hidden []string) string {
	s := strings.TrimSpace(hide(strings.ToValidUTF8(string(b), "\uFFFD"), hidden))
	if len(b) == excerptBytes {
		s = hideCutOff(s, hidden) + "..." // there may be more
	}
	return s
}

// hideCutOff replaces the end of s with "…" when it is the start of one
// of the hidden parts.
func hideCutOff(s string, hidden []string) string {
	for _, p := range hidden {
		for k := len(p) - 1; k >= minHidden; k-- {
			if strings.HasSuffix(s, p[:k]) {
				return s[:len(s)-k] + "…"
			}
		}
	}
	return s
}

// newClient is the default client: no redirects (a webhook that moved is
// a configuration to fix, and a redirected POST may lose its body), and as
// many idle connections per receiver as requests in flight to it, perHost
// (the default transport keeps two: the other connections of a notifier
// sending at its concurrency would be closed and dialled again between
// requests, a third of its HTTP time in BenchmarkNotifier).
func newClient(perHost int) *http.Client {
	tr := http.DefaultTransport.(*http.Transport).Clone()
	tr.MaxIdleConnsPerHost = max(perHost, 2)
	return &http.Client{Transport: tr, CheckRedirect: func(*http.Request, []*http.Request) error { return http.ErrUseLastResponse }}
}

func encodeNotification(effect uuid.UUID, ev *contract.Event) ([]byte, error) {
	return json.Marshal(NewNotification(effect, ev))
}
