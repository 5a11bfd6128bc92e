package testenv

import (
	"crypto/tls"
	"net"
	"testing"
	"time"
)

// GRPCTLSFront is [TLSFront] for a gRPC client: it also offers HTTP/2 by
// ALPN, which gRPC's TLS client requires the server to select. It puts
// TLS in front of a plain gRPC test server (such as qdranttest's), so that
// a test can check a client's TLS settings without a real TLS server.
func GRPCTLSFront(t testing.TB, certs Certificates, backend string) string {
	t.Helper()
	cfg, err := certs.ServerTLS()
	if err != nil {
		t.Fatalf("testenv: %v", err)
	}
	cfg.NextProtos = []string{"h2"}
	l, err := tls.Listen("tcp", "127.0.0.1:0", cfg)
	if err != nil {
		t.Fatalf("testenv: %v", err)
	}
	serveFront(t, l, func() (net.Conn, error) { return net.DialTimeout("tcp", backend, 10*time.Second) })
	return l.Addr().String()
}
