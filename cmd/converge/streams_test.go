package main

import (
	"bytes"
	"context"
	"errors"
	"strings"
	"testing"

	"github.com/nats-io/nats-server/v2/server"
	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/converge-sync/converge/internal/lease"
	"github.com/converge-sync/converge/internal/natsauth"
	"github.com/converge-sync/converge/internal/natsserver"
	"github.com/converge-sync/converge/internal/relay"
	"github.com/converge-sync/converge/pkg/contract"
)

// converge streams apply, as the operator, brings the stream the relay
// created to the relay's new settings, creates the rest, and closes the
// roll-ups of a leases' bucket an earlier version made; the relay, which
// never changes a stream, then runs with those settings and refuses
// others.
func TestStreamsApply(t *testing.T) {
	pw := map[string]string{natsauth.UserOperator: "pw-operator", natsauth.UserRelay: "pw-relay"}
	// The test's own user reads what the operator may change but not read.
	users := append(natsauth.Users(pw), &server.User{Username: "admin", Password: "pw-admin"})
	srv, err := natsserver.StartWith(natsserver.Options{StoreDir: t.TempDir(), Users: users})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(srv.Shutdown)
	ctx := context.Background()
	connect := func(user string) jetstream.JetStream {
		nc, err := nats.Connect(srv.URL, nats.UserInfo(user, pw[user]), nats.CustomInboxPrefix(natsauth.InboxPrefix(user)))
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(nc.Close)
		js, err := jetstream.New(nc)
		if err != nil {
			t.Fatal(err)
		}
		return js
	}
	pw["admin"] = "pw-admin"
	rjs, ojs, ajs := connect(natsauth.UserRelay), connect(natsauth.UserOperator), connect("admin")
	if _, err := relay.EnsureStream(ctx, rjs, relay.StreamConfig{}); err != nil {
		t.Fatal(err)
	}
	// The leases' bucket as an earlier version made it: roll-ups allowed.
	if _, err := ojs.CreateOrUpdateStream(ctx, jetstream.StreamConfig{Name: "KV_" + lease.Bucket, Subjects: []string{"$KV." + lease.Bucket + ".>"},
		MaxMsgsPerSubject: 1, AllowRollup: true, DenyDelete: true, AllowDirect: true, Discard: jetstream.DiscardNew}); err != nil {
		t.Fatal(err)
	}

	t.Setenv(natsauth.EnvPassword, pw[natsauth.UserOperator])
	var out bytes.Buffer
	if err := run(ctx, []string{"streams", "apply", "-nats-url", srv.URL, "-nats-user", natsauth.UserOperator, "-stream-history", "8", "-effects"}, &out); err != nil {
		t.Fatalf("converge streams apply: %v\n%s", err, out.String())
	}
	for _, name := range []string{contract.DocsStream, contract.EventsStream, contract.RemovalsStream, "CONVERGE_DLQ", "CONVERGE_LEASES", "CONVERGE_REBUILDS"} {
		if !strings.Contains(out.String(), name) {
			t.Errorf("the output does not name %s:\n%s", name, out.String())
		}
	}
	if _, err := ajs.Stream(ctx, contract.RemovalsStream); err != nil {
		t.Errorf("the removals' stream after the apply: %v", err)
	}
	docs, err := ojs.Stream(ctx, contract.DocsStream)
	if err != nil {
		t.Fatal(err)
	}
	if n := docs.CachedInfo().Config.MaxMsgsPerSubject; n != 8 {
		t.Errorf("the documents' stream keeps %d per subject, want 8", n)
	}
	leases, err := ajs.Stream(ctx, "KV_"+lease.Bucket)
	if err != nil {
		t.Fatal(err)
	}
	if c := leases.CachedInfo().Config; c.AllowRollup || !c.DenyPurge {
		t.Errorf("the leases' bucket allows roll-ups: %v, deny purge %v", c.AllowRollup, c.DenyPurge)
	}

	cfg := relay.Config{Stream: relay.StreamConfig{MaxMsgsPerSubject: 8}, Effects: relay.EffectsConfig{Enabled: true}}
	if _, err := relay.EnsureStream(ctx, rjs, cfg.Stream); err != nil {
		t.Errorf("the relay with the applied settings: %v", err)
	}
	if _, err := relay.EnsureEffectsStream(ctx, rjs, cfg); err != nil {
		t.Errorf("the relay with the applied settings: %v", err)
	}
	var se *relay.StreamSettingsError
	if _, err := relay.EnsureStream(ctx, rjs, relay.StreamConfig{}); !errors.As(err, &se) {
		t.Errorf("the relay with other settings than the stream's: %v, want a StreamSettingsError", err)
	}
}
