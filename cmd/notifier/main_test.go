package main

import (
	"errors"
	"flag"
	"strings"
	"testing"
)

func TestRunNeedsNATSAndWebhooks(t *testing.T) {
	t.Setenv("CONVERGE_NATS_URL", "")
	if err := run(nil); err == nil || !strings.Contains(err.Error(), "-nats-url") {
		t.Fatalf("without a NATS URL: %v", err)
	}
	t.Setenv("CONVERGE_NATS_URL", "nats://127.0.0.1:1")
	t.Setenv("CONVERGE_WEBHOOK_SECRET", "s")
	t.Setenv("CONVERGE_WEBHOOK_URLS", "")
	if err := run([]string{"-metrics-addr", ""}); err == nil || !strings.Contains(err.Error(), "CONVERGE_WEBHOOK_URLS") {
		t.Fatalf("without webhook URLs: %v", err)
	}
	if err := run([]string{"-h"}); !errors.Is(err, flag.ErrHelp) {
		t.Fatalf("-h: %v", err)
	}
}
