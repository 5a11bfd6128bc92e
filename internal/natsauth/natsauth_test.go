package natsauth_test

import (
	"errors"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/nats-io/nats.go"

	"github.com/converge-sync/converge/internal/config"
	"github.com/converge-sync/converge/internal/natsauth"
	"github.com/converge-sync/converge/internal/notifier"
	"github.com/converge-sync/converge/internal/rebuild"
	"github.com/converge-sync/converge/internal/relay"
	"github.com/converge-sync/converge/internal/writer"
)

// The names natsauth repeats are their owners' (which import
// internal/service, and so cannot be imported by natsauth).
func TestNamesAreTheOwners(t *testing.T) {
	for _, c := range []struct{ name, got, want string }{
		{"IngestStream", natsauth.IngestStream, writer.IngestStream},
		{"IngestConsumer", natsauth.IngestConsumer, writer.IngestConsumer},
		{"IngestDLQName", natsauth.IngestDLQName, writer.IngestDLQName},
		{"RebuildBucket", natsauth.RebuildBucket, rebuild.Bucket},
		{"NotifierBucket", natsauth.NotifierBucket, notifier.DefaultBucket},
		{"PositionBucket", natsauth.PositionBucket, relay.PositionBucket},
		{"RebuildConsumer", natsauth.RebuildConsumer("index"), rebuild.ConsumerName("index")},
	} {
		if c.got != c.want {
			t.Errorf("natsauth.%s = %q, its owner's is %q", c.name, c.got, c.want)
		}
	}
}

func TestUsersNeedAPassword(t *testing.T) {
	users := natsauth.Users(map[string]string{natsauth.UserRelay: "secret", natsauth.UserWriter: ""})
	if len(users) != 1 || users[0].Username != natsauth.UserRelay || users[0].Password != "secret" || users[0].Permissions == nil {
		t.Fatalf("users %+v: want the relay alone, with its password and permissions", users)
	}
}

func TestClientConfigOptions(t *testing.T) {
	dir := t.TempDir()
	seed := filepath.Join(dir, "user.nk")
	// A user seed (nk -gen user), valid only in its form.
	if err := os.WriteFile(seed, []byte("SUAIBDPBAUTWCWBKIO6XHQNINK5FWJW4OHLXC3HQ2KFE4PEJUA44CNHTC4\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	for _, c := range []struct {
		name  string
		cfg   natsauth.ClientConfig
		opts  int
		error string
	}{
		{"none", natsauth.ClientConfig{}, 0, ""},
		{"user", natsauth.ClientConfig{User: "relay", Password: "pw"}, 2, ""},
		{"creds and tls", natsauth.ClientConfig{CredsFile: "relay.creds", CAFile: "ca.pem", CertFile: "c.pem", KeyFile: "k.pem"}, 3, ""},
		{"nkey", natsauth.ClientConfig{NKeyFile: seed}, 1, ""},
		{"nkey and its inboxes", natsauth.ClientConfig{NKeyFile: seed, InboxPrefix: "_INBOX_relay"}, 2, ""},
		{"inbox prefix with a wildcard", natsauth.ClientConfig{NKeyFile: seed, InboxPrefix: "_INBOX_relay.>"}, 0, "inbox prefix"},
		{"inbox prefix ending in a dot", natsauth.ClientConfig{NKeyFile: seed, InboxPrefix: "_INBOX_relay."}, 0, "inbox prefix"},
		{"missing nkey", natsauth.ClientConfig{NKeyFile: filepath.Join(dir, "missing")}, 0, "nkey seed"},
		{"two ways", natsauth.ClientConfig{CredsFile: "a", User: "u", Password: "p"}, 0, "give one of"},
		{"no password", natsauth.ClientConfig{User: "u"}, 0, "has no password"},
		{"no user", natsauth.ClientConfig{Password: "p"}, 0, "without a user"},
		{"user of two tokens", natsauth.ClientConfig{User: "a.b", Password: "p"}, 0, "one subject token"},
		{"user with a wildcard", natsauth.ClientConfig{User: "a>", Password: "p"}, 0, "one subject token"},
		{"cert without key", natsauth.ClientConfig{CertFile: "c.pem"}, 0, "needs both"},
	} {
		t.Run(c.name, func(t *testing.T) {
			opts, err := c.cfg.Options()
			if c.error != "" {
				if err == nil || !strings.Contains(err.Error(), c.error) {
					t.Fatalf("err = %v, want one saying %q", err, c.error)
				}
				return
			}
			if err != nil || len(opts) != c.opts {
				t.Fatalf("%d options, %v; want %d", len(opts), err, c.opts)
			}
		})
	}
}

// The flags take their variables, the password only from the
// environment (or its file); the command line has no password flag.
func TestFlags(t *testing.T) {
	pw := filepath.Join(t.TempDir(), "pw")
	if err := os.WriteFile(pw, []byte("s3cret\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	t.Setenv(natsauth.EnvUser, "relay")
	t.Setenv(natsauth.EnvPassword+"_FILE", pw)
	t.Setenv(natsauth.EnvCA, "/etc/ca.pem")
	f := config.NewFlags("t")
	get := natsauth.Flags(f)
	if err := f.Parse([]string{"-nats-cert", "c.pem", "-nats-key", "k.pem"}); err != nil {
		t.Fatal(err)
	}
	c, err := get()
	if err != nil {
		t.Fatal(err)
	}
	want := natsauth.ClientConfig{User: "relay", Password: "s3cret", CAFile: "/etc/ca.pem", CertFile: "c.pem", KeyFile: "k.pem"}
	if c != want {
		t.Fatalf("config %+v, want %+v", c, want)
	}
	if f.Lookup("nats-password") != nil {
		t.Error("a password flag exists")
	}

	t.Setenv(natsauth.EnvPassword+"_FILE", "")
	f = config.NewFlags("t")
	get = natsauth.Flags(f)
	if err := f.Parse(nil); err != nil {
		t.Fatal(err)
	}
	if _, err := get(); err == nil {
		t.Error("a missing password file is not an error")
	}
}

func TestParseViolation(t *testing.T) {
	for _, c := range []struct {
		err  error
		want natsauth.Violation
		ok   bool
	}{
		{errors.Join(nats.ErrPermissionViolation, errors.New(`Permissions Violation for Publish to "converge.docs.x"`)),
			natsauth.Violation{Op: "Publish", Subject: "converge.docs.x"}, true},
		{errors.Join(nats.ErrPermissionViolation, errors.New(`Permissions Violation for Subscription to "converge.>" using queue "q"`)),
			natsauth.Violation{Op: "Subscription", Subject: "converge.>"}, true},
		{nats.ErrSlowConsumer, natsauth.Violation{}, false},
		{nil, natsauth.Violation{}, false},
	} {
		got, ok := natsauth.ParseViolation(c.err)
		if got != c.want || ok != c.ok {
			t.Errorf("ParseViolation(%v) = %+v, %v; want %+v, %v", c.err, got, ok, c.want, c.ok)
		}
	}
}
