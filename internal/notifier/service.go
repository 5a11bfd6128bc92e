package notifier

import (
	"context"
	"errors"
	"fmt"
	"os"
	"strings"

	"github.com/nats-io/nats.go/jetstream"

	"github.com/converge-sync/converge/internal/config"
	"github.com/converge-sync/converge/internal/projector"
	"github.com/converge-sync/converge/internal/service"
	"github.com/converge-sync/converge/pkg/contract"
)

// Environment variables of the notifier's own settings.
const (
	// EnvPartitions is the notifier's -partitions: the effects' own
	// number of partitions (converge streams apply -effects-partitions),
	// apart from the projectors' CONVERGE_PARTITIONS.
	EnvPartitions    = "CONVERGE_EFFECTS_PARTITIONS"
	EnvWebhookURLs   = "CONVERGE_WEBHOOK_URLS"
	EnvWebhookSecret = "CONVERGE_WEBHOOK_SECRET" //nolint:gosec // the name of a variable, not a credential; also read as _FILE
)

// DefaultMetricsAddr is the notifier's default -metrics-addr.
const DefaultMetricsAddr = "127.0.0.1:9105"

// Flags binds the notifier's own flags (the runtime's are
// [ServiceFlags] binds both); call the returned function after parsing. The
// secret has no flag of its own, so that it never shows in a process list
// or in -h: it is CONVERGE_WEBHOOK_SECRET, CONVERGE_WEBHOOK_SECRET_FILE, or
// the file named by -webhook-secret-file.
func Flags(f *config.Flags) func() (Config, error) {
	urls := f.String("webhook-urls", EnvWebhookURLs, "", "webhook URLs to notify, comma-separated; each is a separate effect")
	secretFile := f.String("webhook-secret-file", "", "", "file holding the HMAC secret that signs requests; without it the secret comes from the environment (env "+EnvWebhookSecret+"), or from the file its _FILE variable names")
	window := f.Duration("window", "CONVERGE_NOTIFIER_WINDOW", DefaultWindow, "dedup window: how long a sent notification is remembered, and the age beyond which an event is not notified")
	replayed := f.Bool("notify-replayed", "CONVERGE_NOTIFIER_NOTIFY_REPLAYED", false, "notify events older than the window, and re-emitted events, too (never twice within the window)")
	claim := f.Duration("claim-timeout", "CONVERGE_NOTIFIER_CLAIM_TIMEOUT", DefaultClaimTimeout, "how long a claim (a crashed sender's) must stay unchanged, as this instance sees it, before it is taken over; must exceed -http-timeout")
	httpTimeout := f.Duration("http-timeout", "CONVERGE_NOTIFIER_HTTP_TIMEOUT", DefaultHTTPTimeout, "bound of one request, answer included")
	sendWait := f.Duration("send-wait", "CONVERGE_NOTIFIER_SEND_WAIT", DefaultSendWait, "how long a batch waits for an answer before the request goes on in the background and its event is redelivered later")
	concurrency := f.Int("concurrency", "CONVERGE_NOTIFIER_CONCURRENCY", DefaultConcurrency, "requests in flight per webhook URL at most")
	attempts := f.Int("max-attempts", "CONVERGE_NOTIFIER_MAX_ATTEMPTS", DefaultMaxAttempts, "attempts of one notification (the first included) before its event is dead-lettered")
	retryMin := f.Duration("retry-min", "CONVERGE_NOTIFIER_RETRY_MIN", DefaultRetryMin, "backoff after the first failed attempt (doubled per attempt, with jitter)")
	retryMax := f.Duration("retry-max", "CONVERGE_NOTIFIER_RETRY_MAX", DefaultRetryMax, "backoff at most")
	bucket := f.String("effects-bucket", "CONVERGE_NOTIFIER_BUCKET", DefaultBucket, "JetStream key-value bucket of the dedup store")
	return func() (Config, error) {
		secret, err := readSecret(f, *secretFile)
		if err != nil {
			return Config{}, err
		}
		list := parseURLs(*urls)
		if len(list) == 0 {
			return Config{}, config.Require("", "webhook-urls", EnvWebhookURLs)
		}
		c := Config{URLs: list, Secret: secret, Window: *window, NotifyReplayed: *replayed, ClaimTimeout: *claim,
			HTTPTimeout: *httpTimeout, SendWait: *sendWait, Concurrency: *concurrency, MaxAttempts: *attempts,
			RetryMin: *retryMin, RetryMax: *retryMax, Bucket: *bucket}
		return c, c.Validate()
	}
}

// parseURLs splits a comma-separated list of webhook URLs, dropping
// blanks.
func parseURLs(list string) []string {
	var out []string
	for u := range strings.SplitSeq(list, ",") {
		if u = strings.TrimSpace(u); u != "" {
			out = append(out, u)
		}
	}
	return out
}

func readSecret(f *config.Flags, file string) ([]byte, error) {
	if file != "" {
		b, err := os.ReadFile(file)
		if err != nil {
			return nil, fmt.Errorf("config: -webhook-secret-file: %w", err)
		}
		return []byte(strings.TrimRight(string(b), "\r\n")), nil
	}
	v, ok, err := f.Env(EnvWebhookSecret)
	if err != nil {
		return nil, err
	}
	if !ok || v == "" {
		return nil, errors.New("config: a webhook secret is required: " + EnvWebhookSecret + ", " + EnvWebhookSecret + "_FILE or -webhook-secret-file")
	}
	return []byte(v), nil
}

// ServiceConfig is the notifier service's configuration: the runtime's
// (NATS, metrics address, consumer) and the notifier's own.
type ServiceConfig struct {
	Projector projector.ServiceConfig
	Notifier  Config
}

// Validate reports a configuration that cannot work.
func (c ServiceConfig) Validate() error {
	if err := c.Projector.Validate(); err != nil {
		return err
	}
	return c.Notifier.Validate()
}

// Connections of the notifier: NATS alone (its dedup store is a
// JetStream key-value bucket).
func (c ServiceConfig) Connections() service.Conns {
	conns := c.Projector.Connections()
	conns.Client = "converge-" + c.Projector.Runtime.Name
	return conns
}

// ServiceFlags binds the notifier's settings (the runtime's and its own,
// see [Flags]) to flags and their environment variables; call the returned
// function after parsing.
func ServiceFlags(f *config.Flags) func() (ServiceConfig, error) {
	sc := projector.ServiceFlags(f, "notifier", DefaultMetricsAddr)
	partitions := f.Int("partitions", EnvPartitions, 0,
		"share the effects among the notifier's instances by partition: the number of the effects' partitions (`converge streams apply -effects -effects-partitions N`), the same for every instance; 0: one instance notifies, the others stand by")
	own := Flags(f)
	return func() (ServiceConfig, error) {
		p, err := sc()
		if err != nil {
			return ServiceConfig{}, err
		}
		p.Partitions = *partitions
		c, err := own()
		if err != nil {
			return ServiceConfig{}, err
		}
		return ServiceConfig{Projector: p, Notifier: c}, nil
	}
}

// Run notifies over deps.NATS until ctx ends, serving /metrics, /healthz
// and /readyz on the metrics address.
func Run(ctx context.Context, cfg ServiceConfig, deps service.Deps) error {
	deps = deps.WithDefaults()
	js, err := deps.JetStream()
	if err != nil {
		return err
	}
	sc := cfg.Projector
	log := deps.Log
	if cfg.Notifier.Replicas <= 0 {
		cfg.Notifier.Replicas = sc.Runtime.Replicas
	}
	if cfg.Notifier.Clock == nil {
		cfg.Notifier.Clock = deps.Clock
	}
	n, err := New(ctx, js, cfg.Notifier, NewMetrics(deps.Registry), log.With("projector", sc.Runtime.Name))
	if err != nil {
		return err
	}
	defer func() { _ = n.Close() }()
	sc.Runtime = RuntimeConfig(sc.Runtime)
	stream := sc.Runtime.Stream
	if sc.Partitions > 1 {
		sc.Source = partitionSource(n, sc.Runtime, cfg.Notifier.Window, log)
		stream = contract.EventsPartitionStream(0) + " to " + contract.EventsPartitionStream(sc.Partitions-1)
	} else {
		sc.Alongside = func(ctx context.Context, js jetstream.JetStream, _ projector.Fencing, _ projector.Exclusive) error {
			return refusePartitions(ctx, js)
		}
		sc.Prepare = func(ctx context.Context, js jetstream.JetStream) error {
			info, err := WaitForStream(ctx, js, cfg.Notifier.Window, log)
			if err != nil {
				return err
			}
			_, err = Migrate(ctx, js, n, sc.Runtime, info, log)
			return err
		}
	}
	targets := make([]string, len(n.targets))
	for i, t := range n.targets {
		targets[i] = t.name
	}
	c := cfg.Notifier
	log.Info("notifier", "stream", stream, "partitions", max(sc.Partitions, 1), "targets", targets, "window", c.Window, "notify_replayed", c.NotifyReplayed,
		"bucket", c.Bucket, "concurrency", c.Concurrency, "max_attempts", c.MaxAttempts)
	return projector.RunService(ctx, sc, n, nil, deps)
}
