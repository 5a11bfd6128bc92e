package relay

import (
	"context"
	"fmt"

	"github.com/nats-io/nats.go/jetstream"

	"github.com/converge-sync/converge/pkg/contract"
)

// EnsureStream creates the document stream, or updates it to cfg.
func EnsureStream(ctx context.Context, js jetstream.JetStream, cfg StreamConfig) (jetstream.Stream, error) {
	cfg.setDefaults()
	s, err := js.CreateOrUpdateStream(ctx, jetstream.StreamConfig{
		Name:              cfg.Name,
		Description:       "converge document events, one subject per document, published by the relay",
		Subjects:          []string{contract.DocsSubjectPrefix + ">"},
		Retention:         jetstream.LimitsPolicy,
		Discard:           jetstream.DiscardOld,
		Storage:           cfg.Storage,
		Replicas:          cfg.Replicas,
		Duplicates:        cfg.Duplicates,
		MaxMsgsPerSubject: cfg.MaxMsgsPerSubject,
		MaxAge:            cfg.MaxAge,
		MaxMsgSize:        contract.MaxMessageBytes,
		AllowDirect:       true,
	})
	if err != nil {
		return nil, fmt.Errorf("relay: ensure stream %s: %w", cfg.Name, err)
	}
	return s, nil
}
