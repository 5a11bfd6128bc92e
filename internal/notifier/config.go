package notifier

import (
	"errors"
	"fmt"
	"net/http"
	"net/url"
	"os"
	"strconv"
	"time"

	"github.com/converge-sync/converge/internal/clock"
)

// Config of a [Notifier]. Zero fields take the defaults documented on them.
type Config struct {
	// URLs are the webhook targets, each one effect per event. Required.
	URLs []string
	// Secret signs every request (HMAC-SHA256). Required.
	Secret []byte
	// Window is the dedup window: how long the record of an effect lives,
	// and the age (from the event's commit) beyond which an event is not
	// notified unless NotifyReplayed. Default 7 days.
	Window time.Duration
	// ClockSkew is added to the bucket's TTL, so that a record outlives the
	// age check despite clocks that disagree (Postgres, NATS, this host).
	// Default 1h.
	ClockSkew time.Duration
	// NotifyReplayed notifies events older than the window, and re-emitted
	// events, too (still never twice within the window).
	NotifyReplayed bool
	// ClaimTimeout is how long a claim stays another sender's before it may
	// be taken over (a crashed sender's): how long this process must have
	// seen it unchanged, on its monotonic clock. Must exceed HTTPTimeout.
	// Default 1m.
	ClaimTimeout time.Duration
	// HTTPTimeout bounds one request, answer included. Default 10s.
	HTTPTimeout time.Duration
	// SendWait is how long a batch waits for a send before leaving it to
	// finish in the background and asking for the event's redelivery.
	// Default 2s.
	SendWait time.Duration
	// Concurrency is the most requests in flight to one URL. Default 8.
	Concurrency int
	// MaxAttempts is the number of attempts of one effect (the first
	// included) after which its event is dead-lettered. Default 8.
	MaxAttempts int
	// RetryMin and RetryMax bound the backoff between attempts (the
	// shared retry.Backoff): RetryMin doubled per failed attempt, capped at
	// RetryMax, with jitter (half of it random). Defaults 1s and 5m.
	RetryMin, RetryMax time.Duration
	// Bucket is the dedup store's key-value bucket; default CONVERGE_EFFECTS.
	Bucket string
	// Replicas of the bucket; default 1.
	Replicas int
	// Owner names this process in its claims; default host/pid.
	Owner string
	// Client sends the requests; nil: a client that follows no redirect
	// (a 3xx answer is a failure).
	Client *http.Client
	// Clock is the wall clock of the records' times, the signatures'
	// timestamps and the events' ages; nil: clock.Wall().
	Clock clock.Clock
}

// Default values of [Config].
const (
	DefaultWindow       = 7 * 24 * time.Hour
	DefaultClockSkew    = time.Hour
	DefaultClaimTimeout = time.Minute
	DefaultHTTPTimeout  = 10 * time.Second
	DefaultSendWait     = 2 * time.Second
	DefaultConcurrency  = 8
	DefaultMaxAttempts  = 8
	DefaultRetryMin     = time.Second
	DefaultRetryMax     = 5 * time.Minute
	DefaultBucket       = "CONVERGE_EFFECTS"
)

func (c *Config) setDefaults() {
	orDefault(&c.Window, DefaultWindow)
	orDefault(&c.ClockSkew, DefaultClockSkew)
	orDefault(&c.ClaimTimeout, DefaultClaimTimeout)
	orDefault(&c.HTTPTimeout, DefaultHTTPTimeout)
	orDefault(&c.SendWait, DefaultSendWait)
	orDefault(&c.Concurrency, DefaultConcurrency)
	orDefault(&c.MaxAttempts, DefaultMaxAttempts)
	orDefault(&c.RetryMin, DefaultRetryMin)
	orDefault(&c.RetryMax, max(DefaultRetryMax, c.RetryMin))
	orDefault(&c.Replicas, 1)
	if c.Bucket == "" {
		c.Bucket = DefaultBucket
	}
	if c.Clock == nil {
		c.Clock = clock.Wall()
	}
	if c.Owner == "" {
		host, _ := os.Hostname()
		c.Owner = host + "/" + strconv.Itoa(os.Getpid())
	}
}

// orDefault sets *v to def when it is zero or negative.
func orDefault[T int | time.Duration](v *T, def T) {
	if *v <= 0 {
		*v = def
	}
}

// Validate sets the defaults and reports what is missing or inconsistent.
func (c *Config) Validate() error {
	c.setDefaults()
	var errs []error
	if len(c.URLs) == 0 {
		errs = append(errs, errors.New("at least one webhook URL is required"))
	}
	seen := map[string]bool{}
	for _, u := range c.URLs {
		if err := checkURL(u); err != nil {
			errs = append(errs, err)
		}
		if seen[u] {
			errs = append(errs, fmt.Errorf("webhook URL %s is given twice", redact(u)))
		}
		seen[u] = true
	}
	if len(c.Secret) == 0 {
		errs = append(errs, errors.New("a webhook secret is required (receivers verify the signature with it)"))
	}
	if c.ClaimTimeout <= c.HTTPTimeout {
		errs = append(errs, fmt.Errorf("the claim timeout (%v) must exceed the HTTP timeout (%v), or a slow send would be taken over while in flight", c.ClaimTimeout, c.HTTPTimeout))
	}
	if c.Window <= c.ClaimTimeout+c.RetryMax {
		errs = append(errs, fmt.Errorf("the window (%v) must exceed the claim timeout plus the longest backoff (%v), or records would expire while their effect is still being retried", c.Window, c.ClaimTimeout+c.RetryMax))
	}
	if c.RetryMax < c.RetryMin {
		errs = append(errs, fmt.Errorf("retry max (%v) is below retry min (%v)", c.RetryMax, c.RetryMin))
	}
	if err := errors.Join(errs...); err != nil {
		return fmt.Errorf("notifier: %w", err)
	}
	return nil
}

func checkURL(raw string) error {
	u, err := url.Parse(raw)
	if err != nil {
		return fmt.Errorf("webhook URL %q: %w", redact(raw), err)
	}
	if (u.Scheme != "http" && u.Scheme != "https") || u.Host == "" {
		return fmt.Errorf("webhook URL %s: want http:// or https:// and a host", redact(raw))
	}
	return nil
}

// redact is the URL without what may be a credential (user info, query,
// fragment), for logs, metrics and dead letters.
func redact(raw string) string {
	u, err := url.Parse(raw)
	if err != nil || u.Host == "" {
		return "(unparseable URL)"
	}
	return u.Scheme + "://" + u.Host + u.EscapedPath()
}
