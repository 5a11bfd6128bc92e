package main

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"strings"
	"testing"

	"github.com/converge-sync/converge/internal/service"
	"github.com/converge-sync/converge/internal/verify"
	"github.com/converge-sync/converge/internal/version"
)

func TestExitCode(t *testing.T) {
	for _, tc := range []struct {
		err  error
		want int
	}{
		{errors.New("postgres: connection refused"), 1},
		{errDisagree, 1},
		{service.Usage("-buckets must be from 1 to %d", verify.MaxBuckets), 2},
		{fmt.Errorf("verify: %w", service.Usage("unknown store %q", "x")), 2},
	} {
		if got := service.ExitCode("converge", tc.err, io.Discard); got != tc.want {
			t.Errorf("exit code of %v: %d, want %d", tc.err, got, tc.want)
		}
	}
}

// An unknown store name is a usage error naming it, found before verify
// connects to anything: verifying the stores it knows and exiting 0 would
// pass a typo off as agreement.
func TestVerifyRefusesAnUnknownStore(t *testing.T) {
	// Nothing listens there: a verify that got as far as Postgres fails
	// otherwise.
	const pgURL = "postgres://converge@127.0.0.1:1/converge?connect_timeout=1"
	for _, tc := range []struct {
		stores, want string
	}{
		{"index,grpah", `unknown store "grpah": want index or graph`},
		{"Index", `unknown store "Index"`},
		{"", "no store to verify"},
		{" , ", "no store to verify"},
	} {
		err := run(context.Background(), []string{"verify", "-stores", tc.stores, "-postgres-url", pgURL}, &bytes.Buffer{})
		if err == nil || !strings.Contains(err.Error(), tc.want) || service.ExitCode("converge", err, io.Discard) != 2 {
			t.Errorf("verify -stores %q: %v (exit %d), want a usage error containing %q", tc.stores, err, service.ExitCode("converge", err, io.Discard), tc.want)
		}
	}
	for _, args := range [][]string{{"-buckets", "0"}, {"--repair", "-repair-timeout", "0s"}, {"--repair", "-writer-url", "127.0.0.1:8080"}} {
		err := run(context.Background(), append([]string{"verify", "-postgres-url", pgURL}, args...), &bytes.Buffer{})
		if err == nil || service.ExitCode("converge", err, io.Discard) != 2 {
			t.Errorf("verify %v: %v (exit %d), want a usage error", args, err, service.ExitCode("converge", err, io.Discard))
		}
	}
}

func TestStoreSides(t *testing.T) {
	got, err := storeSides(" graph , index,graph", "i:1", "g:2")
	if err != nil {
		t.Fatal(err)
	}
	if len(got) != 2 || got[0].Kind != verify.Graph || got[0].Side.Name() != "graph" || got[1].Kind != verify.Index || got[1].Side.Name() != "index" {
		t.Fatalf("sides %+v", got)
	}
}

// converge version prints the build, as text and as JSON; -version does
// the same on every subcommand's flags.
func TestVersion(t *testing.T) {
	var out strings.Builder
	if err := run(context.Background(), []string{"version"}, &out); err != nil {
		t.Fatal(err)
	}
	if got := strings.TrimSpace(out.String()); got != version.Get().String() {
		t.Fatalf("converge version printed %q, want %q", got, version.Get().String())
	}
	out.Reset()
	if err := run(context.Background(), []string{"version", "--json"}, &out); err != nil {
		t.Fatal(err)
	}
	var got version.Info
	if err := json.Unmarshal([]byte(out.String()), &got); err != nil || got != version.Get() {
		t.Fatalf("converge version --json: %q (%v), want %+v", out.String(), err, version.Get())
	}
	if err := run(context.Background(), []string{"version", "extra"}, io.Discard); service.ExitCode("converge", err, io.Discard) != 2 {
		t.Fatalf("converge version extra: %v, want a usage error", err)
	}
}
