package testenv

import (
	"crypto/tls"
	"errors"
	"io"
	"net"
	"sync"
	"testing"
	"time"
)

// TLSFront listens on 127.0.0.1 with TLS (certs' key pair) and forwards
// each connection, decrypted, to backend (host:port on loopback), until t
// ends; it returns the address it listens on. It puts TLS in front of a
// test server that does not offer it itself: the client's link to the
// front is TLS, verified against certs' CA, and the front's link to the
// server stays on loopback inside the test machine.
func TLSFront(t testing.TB, certs Certificates, backend string) string {
	t.Helper()
	cfg, err := certs.ServerTLS()
	if err != nil {
		t.Fatalf("testenv: %v", err)
	}
	l, err := tls.Listen("tcp", "127.0.0.1:0", cfg)
	if err != nil {
		t.Fatalf("testenv: %v", err)
	}
	serveFront(t, l, func() (net.Conn, error) { return net.DialTimeout("tcp", backend, 10*time.Second) })
	return l.Addr().String()
}

// PlainFront listens on 127.0.0.1 without TLS and forwards each
// connection over TLS, trusting certs' CA, to backend: the way of a test's
// own inspecting tools, which speak plain HTTP or gRPC, to a server that
// accepts TLS alone. protocol is what the client behind it speaks, offered
// to the server by ALPN: "h2" for gRPC, "http/1.1" for plain HTTP. It
// returns the address it listens on.
func PlainFront(t testing.TB, certs Certificates, backend, protocol string) string {
	t.Helper()
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatalf("testenv: %v", err)
	}
	cfg := certs.ClientTLS()
	// gRPC over TLS needs HTTP/2 negotiated, and an HTTP/1.1 client's
	// bytes would be misread on a connection the server took for HTTP/2.
	cfg.NextProtos = []string{protocol}
	serveFront(t, l, func() (net.Conn, error) {
		d := &tls.Dialer{NetDialer: &net.Dialer{Timeout: 10 * time.Second}, Config: cfg}
		return d.Dial("tcp", backend)
	})
	return l.Addr().String()
}

// serveFront accepts on l and copies each connection both ways to a
// connection dial opens, until t ends: then it closes the listener and
// every connection, and waits for its goroutines.
func serveFront(t testing.TB, l net.Listener, dial func() (net.Conn, error)) {
	var (
		wg    sync.WaitGroup
		mu    sync.Mutex
		open  = map[net.Conn]struct{}{}
		ended bool
	)
	track := func(c net.Conn) bool {
		mu.Lock()
		defer mu.Unlock()
		if ended {
			_ = c.Close()
			return false
		}
		open[c] = struct{}{}
		return true
	}
	wg.Add(1)
	go func() {
		defer wg.Done()
		for {
			client, err := l.Accept()
			if err != nil {
				return // closed when t ends
			}
			if !track(client) {
				return
			}
			wg.Add(1)
			go func() {
				defer wg.Done()
				server, err := dial()
				if err != nil {
					_ = client.Close()
					return
				}
				if !track(server) {
					_ = client.Close()
					return
				}
				pipe(client, server)
			}()
		}
	}()
	t.Cleanup(func() {
		mu.Lock()
		ended = true
		_ = l.Close()
		for c := range open {
			_ = c.Close()
		}
		mu.Unlock()
		wg.Wait()
	})
}

// pipe copies a to b and b to a until either side ends, then closes both.
func pipe(a, b net.Conn) {
	done := make(chan struct{}, 2)
	copyHalf := func(dst, src net.Conn) {
		_, err := io.Copy(dst, src)
		if err != nil && !errors.Is(err, net.ErrClosed) {
			_ = dst.Close()
		}
		done <- struct{}{}
	}
	go copyHalf(a, b)
	go copyHalf(b, a)
	<-done
	_ = a.Close()
	_ = b.Close()
	<-done
}
