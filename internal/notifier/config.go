package notifier

import (
	"errors"
	"fmt"
	"net/http"
	"net/url"
	"os"
	"slices"
	"strconv"
	"strings"
	"time"

	"github.com/converge-sync/converge/internal/clock"
	"github.com/converge-sync/converge/internal/config"
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
	orDefault(&c.Replicas, config.DefaultReplicas)
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
	// A webhook URL is a credential (its path, query or user info): the
	// errors name it by its position in the list, never by its text.
	seen := map[string]int{}
	for i, u := range c.URLs {
		if err := checkURL(u); err != nil {
			errs = append(errs, fmt.Errorf("webhook URL %d of %d: %w", i+1, len(c.URLs), err))
		}
		if first, ok := seen[u]; ok {
			errs = append(errs, fmt.Errorf("webhook URLs %d and %d of %d are the same", first+1, i+1, len(c.URLs)))
			continue
		}
		seen[u] = i
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

// checkURL says what is wrong with a webhook URL, in words that quote
// none of it.
func checkURL(raw string) error {
	u, err := url.Parse(raw)
	if err != nil {
		// Not wrapped: the *url.Error quotes the whole URL, and its cause
		// may quote a piece of it (a password read as a port).
		return fmt.Errorf("cannot be parsed: %s", parseProblem(err))
	}
	if (u.Scheme != "http" && u.Scheme != "https") || u.Host == "" {
		return errors.New("want http:// or https:// and a host")
	}
	return nil
}

// parseProblem names the problem url.Parse found, from the error's type
// or its fixed wording, without any of the text it quotes.
func parseProblem(err error) string {
	var escape url.EscapeError
	var host url.InvalidHostError
	switch msg := err.Error(); {
	case errors.As(err, &escape):
		return "invalid %-escape"
	case errors.As(err, &host):
		return "invalid character in the host"
	case strings.Contains(msg, "invalid port"):
		return "invalid port"
	case strings.Contains(msg, "invalid userinfo"):
		return "invalid user info"
	case strings.Contains(msg, "control character"):
		return "control character"
	case strings.Contains(msg, "missing protocol scheme"):
		return "no scheme"
	case strings.Contains(msg, "missing ']' in host"):
		return "missing ']' in the host"
	default:
		return "malformed"
	}
}

// elided marks a public name whose URL had more than a scheme and a host.
const elided = "/…"

// targetNames are the public names of the webhook URLs, in their order:
// what logs, metrics, effect records, dead letters, spans and errors call
// each target. A webhook's credential is often its path (a Slack or
// Discord webhook's token) or its query, or is its user info, so a name is
// the scheme and the host alone, followed by "/…" if anything else
// followed them. URLs that share a name are told apart by their place
// among those that share it ("#2", "#3"), which a given list keeps stable.
// No digest of a URL is published: a guessed token could be checked
// against it.
func targetNames(urls []string) []string {
	names := make([]string, len(urls))
	seen := map[string]int{}
	for i, u := range urls {
		name := publicName(u)
		if seen[name]++; seen[name] > 1 {
			name = fmt.Sprintf("%s#%d", name, seen[name])
		}
		names[i] = name
	}
	return names
}

// publicName is raw without its user info, path, query and fragment.
func publicName(raw string) string {
	u, err := url.Parse(raw)
	if err != nil || u.Host == "" {
		return "(unparseable URL)"
	}
	name := u.Scheme + "://" + u.Host
	if (u.Path != "" && u.Path != "/") || u.RawQuery != "" || u.ForceQuery || u.Fragment != "" {
		name += elided
	}
	return name
}

// minHidden is the length below which a piece of a URL is not looked for
// in text: shorter pieces would blank common words, and are no credential.
const minHidden = 4

// hiddenParts are the pieces of a URL that its public name leaves out, in
// the forms text may quote them (escaped or not): its user info, user and
// password; its path, and each segment of it; its query, and each value
// in it; its fragment. Longest first, so that a piece is hidden whole
// before a piece of it is looked for.
func hiddenParts(raw string) []string {
	u, err := url.Parse(raw)
	if err != nil {
		return nil
	}
	parts := []string{u.EscapedPath(), u.Path, u.RawQuery, u.Fragment, u.EscapedFragment()}
	if u.User != nil {
		pw, _ := u.User.Password()
		parts = append(parts, u.User.String(), u.User.Username(), pw)
	}
	parts = append(parts, strings.Split(u.EscapedPath(), "/")...)
	parts = append(parts, strings.Split(u.Path, "/")...)
	if q, err := url.QueryUnescape(u.RawQuery); err == nil {
		parts = append(parts, q)
	}
	for _, values := range u.Query() {
		parts = append(parts, values...)
	}
	var out []string
	for _, p := range parts {
		if len(p) >= minHidden && p != "/" && !slices.Contains(out, p) {
			out = append(out, p)
		}
	}
	slices.SortFunc(out, func(a, b string) int { return len(b) - len(a) })
	return out
}

// hide replaces each of parts in s with "…".
func hide(s string, parts []string) string {
	for _, p := range parts {
		s = strings.ReplaceAll(s, p, "…")
	}
	return s
}

// String is c without its secrets: the targets by their public names, the
// signing secret by its length. A Config printed by mistake (%v, %+v, a
// log field) shows no credential.
func (c Config) String() string {
	return fmt.Sprintf("notifier.Config{URLs: %q, Secret: (%d bytes), Window: %v, ClockSkew: %v, NotifyReplayed: %v, ClaimTimeout: %v, HTTPTimeout: %v, "+
		"SendWait: %v, Concurrency: %d, MaxAttempts: %d, RetryMin: %v, RetryMax: %v, Bucket: %q, Replicas: %d, Owner: %q}",
		targetNames(c.URLs), len(c.Secret), c.Window, c.ClockSkew, c.NotifyReplayed, c.ClaimTimeout, c.HTTPTimeout,
		c.SendWait, c.Concurrency, c.MaxAttempts, c.RetryMin, c.RetryMax, c.Bucket, c.Replicas, c.Owner)
}

// GoString is String, for %#v.
func (c Config) GoString() string { return c.String() }
