package testenv

import (
	"bufio"
	"crypto/tls"
	"crypto/x509"
	"errors"
	"io"
	"net"
	"strings"
	"testing"
)

// The server key pair of NewCertificates is verified, for 127.0.0.1 and
// for localhost, by a client that trusts the CA alone, and refused by one
// that trusts other roots; and the fronts carry bytes both ways: a client
// of PlainFront reaches, in plain text, a plain server behind a TLSFront,
// over TLS between the two.
func TestCertificatesAndFronts(t *testing.T) {
	certs := NewCertificates(t)
	serverTLS, err := certs.ServerTLS()
	if err != nil {
		t.Fatal(err)
	}
	l, err := tls.Listen("tcp", "127.0.0.1:0", serverTLS)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = l.Close() })
	go func() {
		for {
			c, err := l.Accept()
			if err != nil {
				return
			}
			go func() {
				defer func() { _ = c.Close() }()
				_ = c.(*tls.Conn).Handshake()
			}()
		}
	}()
	_, port, _ := net.SplitHostPort(l.Addr().String())
	for _, host := range []string{"127.0.0.1", "localhost"} {
		cfg := certs.ClientTLS()
		cfg.ServerName = host
		c, err := tls.Dial("tcp", "127.0.0.1:"+port, cfg)
		if err != nil {
			t.Errorf("a client trusting the CA, for %s: %v", host, err)
			continue
		}
		_ = c.Close()
	}
	other := NewCertificates(t) // another CA: not the one that signed
	_, err = tls.Dial("tcp", l.Addr().String(), other.ClientTLS())
	if _, ok := errors.AsType[x509.UnknownAuthorityError](err); !ok {
		t.Errorf("a client trusting another CA: %v; want x509.UnknownAuthorityError", err)
	}

	// An echo server, in plain text, behind both fronts.
	echo, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = echo.Close() })
	go func() {
		for {
			c, err := echo.Accept()
			if err != nil {
				return
			}
			go func() {
				defer func() { _ = c.Close() }()
				_, _ = io.Copy(c, c)
			}()
		}
	}()
	front := PlainFront(t, certs, TLSFront(t, certs, echo.Addr().String()), "http/1.1")
	c, err := net.Dial("tcp", front)
	if err != nil {
		t.Fatal(err)
	}
	defer func() { _ = c.Close() }()
	if _, err := io.WriteString(c, "through both fronts\n"); err != nil {
		t.Fatal(err)
	}
	got, err := bufio.NewReader(c).ReadString('\n')
	if err != nil || got != "through both fronts\n" {
		t.Fatalf("echoed %q, %v", got, err)
	}
	// And TLSFront refuses a client that does not trust the CA.
	_, err = tls.Dial("tcp", TLSFront(t, certs, echo.Addr().String()), other.ClientTLS())
	if err == nil || !strings.Contains(err.Error(), "certificate") {
		t.Errorf("TLSFront with another CA: %v; want a certificate error", err)
	}
}
