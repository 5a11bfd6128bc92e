package service_test

import (
	"context"
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/x509"
	"crypto/x509/pkix"
	"encoding/pem"
	"errors"
	"math/big"
	"net/http"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/converge-sync/converge/internal/auth"
	"github.com/converge-sync/converge/internal/config"
	"github.com/converge-sync/converge/internal/projector"
	"github.com/converge-sync/converge/internal/service"
	"github.com/converge-sync/converge/internal/testenv"
	"github.com/converge-sync/converge/internal/writer"
)

// tokensFile writes a tokens file of one token.
func tokensFile(t *testing.T) string {
	t.Helper()
	path := filepath.Join(t.TempDir(), "tokens")
	if err := os.WriteFile(path, []byte("ops admin,read,write sk_0123456789abcdef0123\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	return path
}

// keyPair writes a self-signed certificate for 127.0.0.1 and its key.
func keyPair(t *testing.T) (cert, key string) {
	t.Helper()
	k, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		t.Fatal(err)
	}
	tmpl := &x509.Certificate{SerialNumber: big.NewInt(1), Subject: pkix.Name{CommonName: "converge test"},
		NotBefore: time.Now().Add(-time.Hour), NotAfter: time.Now().Add(time.Hour)}
	der, err := x509.CreateCertificate(rand.Reader, tmpl, tmpl, &k.PublicKey, k)
	if err != nil {
		t.Fatal(err)
	}
	kder, err := x509.MarshalPKCS8PrivateKey(k)
	if err != nil {
		t.Fatal(err)
	}
	dir := t.TempDir()
	cert, key = filepath.Join(dir, "cert.pem"), filepath.Join(dir, "key.pem")
	if err := os.WriteFile(cert, pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE", Bytes: der}), 0o600); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(key, pem.EncodeToMemory(&pem.Block{Type: "PRIVATE KEY", Bytes: kder}), 0o600); err != nil {
		t.Fatal(err)
	}
	return cert, key
}

// Every service that accepts bearer tokens refuses, at its start and
// before it listens, to accept them over plain HTTP on an address beyond
// loopback, naming the address and the flags that would allow it.
func TestServicesRefuseTokensInClearBeyondLoopback(t *testing.T) {
	clearEnv(t)
	t.Setenv(auth.EnvInsecurePlainHTTP, "false")
	n := testenv.StartNATS(t)
	tokens := tokensFile(t)
	// 192.0.2.1 (TEST-NET-1) is no address of this machine: a service
	// that did not refuse would fail to listen, never listening beyond
	// loopback in a test.
	for _, tc := range []struct {
		service string
		args    []string
	}{
		// The pool connects lazily: nothing listens at this URL.
		{"writer", []string{"-postgres-url", "postgres://converge@127.0.0.1:1/converge", "-http-addr", "192.0.2.1:0", "-metrics-addr", ""}},
		{"projector-index", []string{"-nats-url", n.URL, "-data-dir", t.TempDir(), "-metrics-addr", "192.0.2.1:0"}},
		{"projector-graph", []string{"-nats-url", n.URL, "-data-dir", t.TempDir(), "-metrics-addr", "192.0.2.1:0"}},
	} {
		t.Run(tc.service, func(t *testing.T) {
			err := commands()[tc.service](context.Background(), append(tc.args, "-tokens-file", tokens))
			if !errors.Is(err, auth.ErrPlainHTTP) {
				t.Fatalf("%v; want the tokens refused over plain HTTP", err)
			}
			for _, want := range []string{"192.0.2.1:0", "-tls-cert", "-tls-key", "-insecure-plain-http"} {
				if !strings.Contains(err.Error(), want) {
					t.Errorf("the refusal does not name %s: %v", want, err)
				}
			}
		})
	}
}

// With a certificate, or told that the network is trusted, a service
// with tokens beyond loopback passes the check: the writer goes on to its
// database and a projector to NATS, which these have not (so that
// nothing listens; 192.0.2.1 is no address of this machine anyway).
func TestServicesAcceptTokensBeyondLoopbackOverTLSOrWhenTold(t *testing.T) {
	tokens := tokensFile(t)
	cert, key := keyPair(t)
	for _, tc := range []struct {
		name     string
		security auth.Settings
		refused  bool
	}{
		{"plain HTTP", auth.Settings{TokensFile: tokens}, true},
		{"TLS", auth.Settings{TokensFile: tokens, TLSCert: cert, TLSKey: key}, false},
		{"told the network is trusted", auth.Settings{TokensFile: tokens, InsecurePlainHTTP: true}, false},
	} {
		t.Run(tc.name, func(t *testing.T) {
			s := tc.security
			wc := writer.ServiceConfig{PostgresURL: "postgres://unused", HTTPAddr: "192.0.2.1:8080",
				TokensFile: s.TokensFile, TLSCert: s.TLSCert, TLSKey: s.TLSKey, InsecurePlainHTTP: s.InsecurePlainHTTP}
			err := writer.Run(context.Background(), wc, service.Deps{})
			if got := errors.Is(err, auth.ErrPlainHTTP); got != tc.refused || (!tc.refused && !strings.Contains(err.Error(), "no Postgres pool")) {
				t.Errorf("writer: %v; want refused %v", err, tc.refused)
			}

			pc := projector.ServiceConfig{MetricsAddr: "192.0.2.1:9103", Security: s, Runtime: projector.Config{Name: "index"}}
			err = projector.RunService(context.Background(), pc, nil, map[string]http.Handler{"GET /v1/search": http.NotFoundHandler()}, service.Deps{})
			if got := errors.Is(err, auth.ErrPlainHTTP); got != tc.refused || (!tc.refused && !strings.Contains(err.Error(), "no NATS connection")) {
				t.Errorf("projector: %v; want refused %v", err, tc.refused)
			}
		})
	}
}

// -insecure-plain-http and CONVERGE_INSECURE_PLAIN_HTTP reach the
// writer's configuration, as auth.BindFlags binds them for every service.
func TestWriterFlagsBindInsecurePlainHTTP(t *testing.T) {
	clearEnv(t)
	t.Setenv(auth.EnvInsecurePlainHTTP, "true")
	f := config.NewFlags("writer")
	get := writer.Flags(f)
	if err := f.Parse([]string{"-postgres-url", "postgres://x"}); err != nil {
		t.Fatal(err)
	}
	cfg, err := get()
	if err != nil || !cfg.InsecurePlainHTTP {
		t.Fatalf("config %+v, %v; want InsecurePlainHTTP", cfg, err)
	}
}
