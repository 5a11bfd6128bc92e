package main

import (
	"context"
	"fmt"
	"io"
	"net/http"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/converge-sync/converge/internal/auth"
	"github.com/converge-sync/converge/internal/console"
	"github.com/converge-sync/converge/internal/service"
	"github.com/converge-sync/converge/internal/stack"
	"github.com/converge-sync/converge/internal/testenv"
)

// converge console refuses, before it connects to anything, to serve
// beyond loopback without tokens, as the projectors do, and a step of no
// interval.
func TestConsoleRefusesWhatCannotWork(t *testing.T) {
	for _, tc := range []struct {
		args []string
		want string
	}{
		{[]string{"-addr", "0.0.0.0:9107"}, "refusing to serve 0.0.0.0:9107 without authentication"},
		{[]string{"-interval", "0s"}, "-interval must be positive"},
		{[]string{"extra"}, "console takes no arguments"},
	} {
		args := append([]string{"console", "-postgres-url", "postgres://converge@127.0.0.1:1/converge", "-nats-url", "nats://127.0.0.1:1"}, tc.args...)
		err := run(context.Background(), args, io.Discard)
		if err == nil || !strings.Contains(err.Error(), tc.want) || service.ExitCode("converge", err, io.Discard) != 2 {
			t.Errorf("%v: %v, want a usage error with %q", args, err, tc.want)
		}
	}
}

// converge console over TLS with tokens: the page is served over HTTPS to
// anyone, its reading needs a token with the read scope, its redrive the
// admin scope; plain HTTP is not answered.
func TestConsoleServesOverTLSBehindTokens(t *testing.T) {
	certs := testenv.NewCertificates(t)
	nats := testenv.StartNATS(t)
	const admin, reader = "console-admin-token-0123456789", "console-reader-token-012345678"
	tokens := filepath.Join(t.TempDir(), "tokens")
	if err := os.WriteFile(tokens, []byte("operator admin,read "+admin+"\nviewer read "+reader+"\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	addr, err := stack.FreeAddr()
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() {
		done <- run(ctx, []string{"console", "-addr", addr, "-postgres-url", "postgres://converge@127.0.0.1:1/converge?connect_timeout=1",
			"-nats-url", nats.URL, "-tokens-file", tokens, "-tls-cert", certs.CertFile, "-tls-key", certs.KeyFile,
			"-writer-metrics-addr", "", "-relay-metrics-addr", "", "-index-addr", "", "-graph-addr", "", "-verify-addr", "", "-log-level", "error"}, io.Discard)
	}()
	defer func() {
		cancel()
		if err := <-done; err != nil {
			t.Errorf("console ended with %v", err)
		}
	}()
	hc := &http.Client{Timeout: 5 * time.Second, Transport: &http.Transport{TLSClientConfig: certs.ClientTLS()}}
	get := func(method, path, token string) (int, string) {
		req, err := http.NewRequest(method, "https://"+addr+path, strings.NewReader(`{"seqs":[1]}`))
		if err != nil {
			t.Fatal(err)
		}
		auth.SetBearer(req.Header, token)
		resp, err := hc.Do(req)
		if err != nil {
			return 0, err.Error()
		}
		defer resp.Body.Close()
		b, _ := io.ReadAll(resp.Body)
		return resp.StatusCode, string(b)
	}
	if err := stack.WaitUntil(ctx, ctx, 20*time.Second, func() bool { code, _ := get("GET", "/", ""); return code == http.StatusOK }); err != nil {
		t.Fatalf("the console's page over https: %v", err)
	}
	redrive := strings.Replace(console.RedrivePath, "{consumer}", "ingest", 1)
	for _, tc := range []struct {
		method, path, token string
		want                int
	}{
		{"GET", console.ReadingPath, "", http.StatusUnauthorized},
		{"POST", redrive, reader, http.StatusForbidden},
		{"GET", console.AccessPath, reader, http.StatusOK},
	} {
		if code, body := get(tc.method, tc.path, tc.token); code != tc.want {
			t.Errorf("%s %s: %d %s, want %d", tc.method, tc.path, code, body, tc.want)
		}
	}
	// The reading answers once read; what could not be read (Postgres
	// here) is named in it.
	if err := stack.WaitUntil(ctx, ctx, 20*time.Second, func() bool {
		code, body := get("GET", console.ReadingPath, reader)
		return code == http.StatusOK && strings.Contains(body, `"slot: `)
	}); err != nil {
		code, body := get("GET", console.ReadingPath, reader)
		t.Errorf("the reading: %d %s", code, body)
	}
	resp, err := http.Get(fmt.Sprintf("http://%s/", addr))
	if err == nil {
		_ = resp.Body.Close()
		if resp.StatusCode == http.StatusOK {
			t.Errorf("the console answered plain HTTP: %s", resp.Status)
		}
	}
}
