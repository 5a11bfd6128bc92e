package notifier

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"net/url"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/google/uuid"

	"github.com/converge-sync/converge/internal/clock"
	"github.com/converge-sync/converge/internal/config"
	"github.com/converge-sync/converge/internal/projector"
	"github.com/converge-sync/converge/pkg/contract"
)

// Known answer, computed with
// printf '%s' '1700000000.{"a":1}' | openssl dgst -sha256 -hmac 'whsec_test'
func TestSignKnownAnswer(t *testing.T) {
	got := Sign([]byte("whsec_test"), "1700000000", []byte(`{"a":1}`))
	if want := "sha256=38877139021993b830af32feea6e18a8da83eb2f6e49ee50bd9e4cf4ca4d3789"; got != want {
		t.Fatalf("Sign = %s, want %s", got, want)
	}
}

func TestVerify(t *testing.T) {
	secret, body := []byte("s"), []byte(`{"x":1}`)
	now := time.Unix(1_700_000_000, 0)
	ts := "1700000000"
	sig := Sign(secret, ts, body)
	for _, tc := range []struct {
		name      string
		secret    []byte
		ts, sig   string
		body      []byte
		tolerance time.Duration
		now       time.Time
		want      error
	}{
		{"valid", secret, ts, sig, body, 5 * time.Minute, now, nil},
		{"valid without tolerance", secret, ts, sig, body, 0, now.Add(time.Hour), nil},
		{"other secret", []byte("t"), ts, sig, body, 0, now, ErrBadSignature},
		{"other body", secret, ts, sig, []byte(`{"x":2}`), 0, now, ErrBadSignature},
		{"other timestamp", secret, "1700000001", sig, body, 0, now, ErrBadSignature},
		{"too old", secret, ts, sig, body, 5 * time.Minute, now.Add(6 * time.Minute), ErrStale},
		{"from the future", secret, ts, sig, body, 5 * time.Minute, now.Add(-6 * time.Minute), ErrStale},
	} {
		t.Run(tc.name, func(t *testing.T) {
			if err := Verify(tc.secret, tc.ts, tc.sig, tc.body, tc.tolerance, tc.now); !errors.Is(err, tc.want) {
				t.Fatalf("Verify = %v, want %v", err, tc.want)
			}
		})
	}
}

// The body is a pure function of the effect and the event: every attempt,
// by any process, sends the same bytes.
func TestNotificationBody(t *testing.T) {
	ev := upsert("doc", 3)
	effect := EffectID("https://example.com/hook", ev.ID)
	a, err := encodeNotification(effect, &ev)
	if err != nil {
		t.Fatal(err)
	}
	b, _ := encodeNotification(effect, &ev)
	if string(a) != string(b) {
		t.Fatal("two encodings differ")
	}
	var fields map[string]any
	if err := json.Unmarshal(a, &fields); err != nil {
		t.Fatal(err)
	}
	for k, want := range map[string]any{"schema": NotificationSchema, "effect_id": effect.String(), "event_id": ev.ID.String(),
		"kind": "document.upserted", "key": "doc", "version": 3.0, "withdrawn": false, "content_hash": ev.ContentHash, "chunks": 1.0} {
		if fields[k] != want {
			t.Errorf("%s = %v, want %v", k, fields[k], want)
		}
	}
	w := contract.NewWithdrawnEvent("doc", 4)
	c, _ := encodeNotification(EffectID("https://example.com/hook", w.ID), &w)
	var n Notification
	if err := json.Unmarshal(c, &n); err != nil || !n.Withdrawn || n.Kind != contract.KindWithdrawn || n.Title != "" {
		t.Fatalf("withdrawal: %s %v", c, err)
	}
}

// The effect id is the contract's: uuid5(EffectNS, "webhook:" + url + ":" +
// event id), one per URL and event.
func TestEffectID(t *testing.T) {
	ev := uuid.MustParse("0a0e9c3a-67a5-5d8d-8d4c-6a1f3b0c2d11")
	a := EffectID("https://a.example/hook", ev)
	if a != uuid.NewSHA1(contract.EffectNS, []byte("webhook:https://a.example/hook:"+ev.String())) {
		t.Fatal("EffectID is not the contract's derivation")
	}
	if a == EffectID("https://b.example/hook", ev) || a.Version() != 5 {
		t.Fatal("two URLs share an effect id, or it is not a UUIDv5")
	}
}

func TestConfigValidate(t *testing.T) {
	ok := Config{URLs: []string{"https://a.example/hook"}, Secret: []byte("s")}
	if err := ok.Validate(); err != nil {
		t.Fatal(err)
	}
	if ok.Window != DefaultWindow || ok.ClaimTimeout != DefaultClaimTimeout || ok.Concurrency != DefaultConcurrency || ok.Bucket != DefaultBucket || ok.Owner == "" {
		t.Fatalf("defaults not set: %+v", ok)
	}
	for _, tc := range []struct {
		name string
		cfg  Config
		want string
	}{
		{"no URL", Config{Secret: []byte("s")}, "at least one webhook URL"},
		{"no secret", Config{URLs: []string{"https://a.example"}}, "secret is required"},
		{"not http", Config{URLs: []string{"ftp://a.example"}, Secret: []byte("s")}, "want http:// or https://"},
		{"no host", Config{URLs: []string{"https:///x"}, Secret: []byte("s")}, "want http:// or https://"},
		{"twice", Config{URLs: []string{"https://a.example", "https://b.example", "https://a.example"}, Secret: []byte("s")}, "webhook URLs 1 and 3 of 3 are the same"},
		{"claim timeout too short", Config{URLs: []string{"https://a.example"}, Secret: []byte("s"), ClaimTimeout: time.Second, HTTPTimeout: 2 * time.Second}, "must exceed the HTTP timeout"},
		{"window too short", Config{URLs: []string{"https://a.example"}, Secret: []byte("s"), Window: time.Minute}, "the window (1m0s) must exceed"},
		{"retry bounds", Config{URLs: []string{"https://a.example"}, Secret: []byte("s"), RetryMin: time.Minute, RetryMax: time.Second}, "retry max"},
		{"credentials not echoed", Config{URLs: []string{"https://u:pw@a.example/x?token=t0ps3cret", "https://u:pw@a.example/x?token=t0ps3cret"}}, "webhook URLs 1 and 2 of 2 are the same"},
		{"bad port", Config{URLs: []string{"https://a.example", "https://u:pw@a.example:80x/t0ps3cret"}}, "webhook URL 2 of 2: cannot be parsed: invalid port"},
		{"password read as a port", Config{URLs: []string{"https://u:t0ps3cret/x@a.example/h"}}, "webhook URL 1 of 1: cannot be parsed: invalid port"},
		{"bad escape", Config{URLs: []string{"https://u:pw@a.example/t0ps3cret%zz"}}, "webhook URL 1 of 1: cannot be parsed: invalid %-escape"},
		{"control character", Config{URLs: []string{"https://u:pw@a.example/t0ps3cret\x7f"}}, "webhook URL 1 of 1: cannot be parsed: control character"},
		{"bad host", Config{URLs: []string{"https://u:pw@a b/t0ps3cret"}}, "webhook URL 1 of 1: cannot be parsed: invalid character in the host"},
		{"no scheme", Config{URLs: []string{"u:pw@a.example/t0ps3cret"}}, "webhook URL 1 of 1: want http:// or https://"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			err := tc.cfg.Validate()
			if err == nil || !strings.Contains(err.Error(), tc.want) {
				t.Fatalf("Validate = %v, want %q", err, tc.want)
			}
			if strings.Contains(err.Error(), "t0ps3cret") || strings.Contains(err.Error(), "pw@") {
				t.Fatalf("a credential leaked: %v", err)
			}
		})
	}
}

// A target's public name is its URL's scheme and host, with "/…" for
// whatever followed them, and an ordinal among the names it shares.
func TestTargetNames(t *testing.T) {
	urls := []string{
		"https://hooks.slack.com/services/T000/B000/XXXX",
		"https://hooks.slack.com/services/T000/B000/YYYY",
		"https://user:pw@a.example:8443?token=x",
		"http://a.example/",
		"http://a.example",
		"http://a.example/#frag",
		"https://hooks.slack.com/services/T000/B000/ZZZZ",
		"::",
	}
	want := []string{
		"https://hooks.slack.com/…",
		"https://hooks.slack.com/…#2",
		"https://a.example:8443/…",
		"http://a.example",
		"http://a.example#2",
		"http://a.example/…",
		"https://hooks.slack.com/…#3",
		"(unparseable URL)",
	}
	if got := targetNames(urls); !slices.Equal(got, want) {
		t.Fatalf("targetNames =\n%q\nwant\n%q", got, want)
	}
}

// A receiver's answer that quotes the URL's path or credentials, whole or
// cut off by the excerpt's end, loses them; the transport's error loses
// the *url.Error that quotes the whole URL.
func TestSendErrorHidesTheURL(t *testing.T) {
	raw := "https://us3r:pa55w0rd@hooks.example.com/services/T000/B000/t0ps3cret?k=qu3ry"
	hidden := hiddenParts(raw)
	body := "Cannot POST /services/T000/B000/t0ps3cret for us3r:pa55w0rd (qu3ry)"
	if got := excerpt([]byte(body), hidden); got != "Cannot POST … for … (…)" {
		t.Errorf("excerpt = %q", got)
	}
	long := strings.Repeat("x", excerptBytes-len("/services/T000/B000/t0ps3")) + "/services/T000/B000/t0ps3"
	if got := excerpt([]byte(long), hidden); strings.Contains(got, "t0ps") || !strings.HasSuffix(got, "x/…/…/…/…...") {
		t.Errorf("excerpt cut inside the path = %q", got[len(got)-30:])
	}
	cause := errors.New("malformed HTTP response to /services/T000/B000/t0ps3cret")
	se := &sendError{Target: "https://hooks.example.com/…", Err: withoutURL(&url.Error{Op: "Post", URL: raw, Err: cause}), hidden: hidden}
	for _, secret := range []string{"t0ps3cret", "pa55w0rd", "us3r", "qu3ry"} {
		if strings.Contains(se.Error(), secret) {
			t.Errorf("%q quotes %s", se.Error(), secret)
		}
	}
	if !errors.Is(se, cause) {
		t.Errorf("the cause is lost: %#v", se.Err)
	}
}

// The backoff doubles per attempt up to RetryMax, and half of it is
// random: never below half, never above the whole.
func TestBackoff(t *testing.T) {
	n := &Notifier{cfg: Config{RetryMin: 100 * time.Millisecond, RetryMax: time.Second}}
	for attempt, full := range map[int]time.Duration{1: 100 * time.Millisecond, 2: 200 * time.Millisecond, 4: 800 * time.Millisecond, 5: time.Second, 30: time.Second} {
		seen := map[time.Duration]bool{}
		for range 200 {
			d := n.backoff(attempt)
			if d < full/2 || d > full {
				t.Fatalf("attempt %d: %v outside [%v, %v]", attempt, d, full/2, full)
			}
			seen[d] = true
		}
		if len(seen) < 10 {
			t.Fatalf("attempt %d: only %d distinct delays: no jitter", attempt, len(seen))
		}
	}
}

func TestSkipReason(t *testing.T) {
	n := &Notifier{cfg: Config{Window: time.Hour, Clock: clock.Wall()}}
	ev := upsert("doc", 1)
	recent, old := time.Now().Add(-time.Minute), time.Now().Add(-2*time.Hour)
	for _, tc := range []struct {
		name   string
		d      projector.Delivery
		repair bool
		want   string
	}{
		{"recent", projector.Delivery{Event: &ev, CommitTime: recent}, false, ""},
		{"old", projector.Delivery{Event: &ev, CommitTime: old}, false, "beyond_window"},
		{"old by the stream's time", projector.Delivery{Event: &ev, Stored: old}, false, "beyond_window"},
		{"commit time wins", projector.Delivery{Event: &ev, CommitTime: recent, Stored: old}, false, ""},
		{"age unknown", projector.Delivery{Event: &ev}, false, ""},
		{"re-emission", projector.Delivery{Event: &ev, CommitTime: recent}, true, "reemission"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			if got := n.skipReason(tc.d, tc.repair); got != tc.want {
				t.Fatalf("skipReason = %q, want %q", got, tc.want)
			}
		})
	}
	// The age is read on the notifier's clock: two hours ahead, a minute
	// old commit is beyond the window of an hour.
	n.cfg.Clock = clock.NewShifted(2 * time.Hour)
	if got := n.skipReason(projector.Delivery{Event: &ev, CommitTime: recent}, false); got != "beyond_window" {
		t.Fatalf("with the clock 2h ahead: %q, want beyond_window", got)
	}
	n.cfg.NotifyReplayed = true
	if got := n.skipReason(projector.Delivery{Event: &ev, CommitTime: old}, true); got != "" {
		t.Fatalf("with NotifyReplayed: %q", got)
	}
}

func TestMultiErrorIsOneLine(t *testing.T) {
	a, b := errors.New("a"), errors.New("b\nc")
	err := joinErrors([]error{a, b})
	if !errors.Is(err, a) || !errors.Is(err, b) || err.Error() != "a; b\nc" {
		t.Fatalf("%q", err)
	}
	se := &sendError{Target: "https://x/h", Status: 500, Excerpt: "line1\nline2"}
	if strings.Contains(se.Error(), "\n") {
		t.Fatalf("a send error spans lines: %q", se.Error())
	}
}

func TestFlags(t *testing.T) {
	dir := t.TempDir()
	secretFile := filepath.Join(dir, "secret")
	if err := os.WriteFile(secretFile, []byte("from-file\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	t.Setenv(EnvWebhookURLs, "https://a.example/hook, https://b.example/hook,")
	t.Setenv(EnvWebhookSecret+"_FILE", secretFile)
	t.Setenv("CONVERGE_NOTIFIER_WINDOW", "48h")
	f := config.NewFlags("notifier")
	cfg := Flags(f)
	if err := f.Parse([]string{"-notify-replayed", "-concurrency", "3"}); err != nil {
		t.Fatal(err)
	}
	c, err := cfg()
	if err != nil {
		t.Fatal(err)
	}
	if len(c.URLs) != 2 || c.URLs[1] != "https://b.example/hook" || string(c.Secret) != "from-file" || c.Window != 48*time.Hour ||
		!c.NotifyReplayed || c.Concurrency != 3 {
		t.Fatalf("config: %+v", c)
	}

	t.Setenv(EnvWebhookSecret+"_FILE", "")
	os.Unsetenv(EnvWebhookSecret + "_FILE") //nolint:errcheck
	f = config.NewFlags("notifier")
	cfg = Flags(f)
	if err := f.Parse(nil); err != nil {
		t.Fatal(err)
	}
	if _, err := cfg(); err == nil || !strings.Contains(err.Error(), "secret is required") {
		t.Fatalf("no secret: %v", err)
	}
	t.Setenv(EnvWebhookSecret, "from-env")
	t.Setenv(EnvWebhookURLs, "")
	f = config.NewFlags("notifier")
	cfg = Flags(f)
	if err := f.Parse(nil); err != nil {
		t.Fatal(err)
	}
	if _, err := cfg(); err == nil || !strings.Contains(err.Error(), EnvWebhookURLs) {
		t.Fatalf("no URLs: %v", err)
	}
}

// The plain Store entry point notifies events of unknown age.
func TestApplyWithoutDeliveries(t *testing.T) {
	e := newEnv(t)
	rcv := newReceiver(t)
	n := e.newNotifier(testConfig(rcv.url("/hook")))
	ev := upsert("doc", 1)
	res := n.Apply(context.Background(), []*contract.Event{&ev, &ev})
	if len(res) != 2 || res[0].Err != nil || res[1].Err != nil || res[0].Outcome != projector.Applied {
		t.Fatalf("results: %+v", res)
	}
	if res := n.Apply(context.Background(), []*contract.Event{&ev}); res[0].Err != nil || res[0].Outcome != projector.Skipped {
		t.Fatalf("again: %+v", res)
	}
	if perEffect := rcv.check(); len(perEffect) != 1 || perEffect[EffectID(rcv.url("/hook"), ev.ID).String()] != 1 {
		t.Fatalf("requests: %v", perEffect)
	}
}

// A Config printed by mistake, in any verb and inside what holds it, shows
// neither a webhook's credentials nor the signing secret.
func TestConfigPrintsNoSecret(t *testing.T) {
	c := Config{URLs: []string{"https://user:hunter22@hooks.example.com/services/T000/B000/tok3nXYZ?key=q7secret"}, Secret: []byte("signing-s3cret")}
	sc := ServiceConfig{Notifier: c}
	for _, s := range []string{fmt.Sprint(c), fmt.Sprintf("%+v", c), fmt.Sprintf("%#v", c), fmt.Sprintf("%v", &c), fmt.Sprintf("%+v", sc)} {
		for _, secret := range []string{"hunter22", "tok3nXYZ", "q7secret", "signing-s3cret", "T000"} {
			if strings.Contains(s, secret) {
				t.Errorf("%q shows %q", s, secret)
			}
		}
		if !strings.Contains(s, "https://hooks.example.com/…") {
			t.Errorf("%q does not name the target", s)
		}
	}
}
