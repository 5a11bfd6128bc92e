package testenv

import (
	"errors"
	"fmt"
	"net"
	"sync"
	"testing"
	"time"

	"github.com/nats-io/nats-server/v2/server"
	"github.com/nats-io/nats.go"

	"github.com/converge-sync/converge/pkg/contract"
)

// NATS is an embedded nats-server with JetStream and a file store.
type NATS struct {
	Server   *server.Server
	URL      string
	StoreDir string
	// Port is the bound client port; pass it to StartNATSAt to restart the
	// server where clients expect it.
	Port int

	once sync.Once
}

// StartNATS starts a server on a random 127.0.0.1 port with its store in a
// test temp dir, and shuts it down when the test ends.
func StartNATS(t testing.TB) *NATS {
	t.Helper()
	n, err := StartNATSAt(t.TempDir(), -1)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(n.Shutdown)
	return n
}

// StartNATSAt starts a server with the given store dir and port (-1 or 0:
// random). Reusing the store dir and port of a shut down server simulates a
// restart: JetStream streams and messages persist.
func StartNATSAt(storeDir string, port int) (*NATS, error) {
	if port == 0 {
		port = -1
	}
	ns, err := server.NewServer(&server.Options{
		Host:      "127.0.0.1",
		Port:      port,
		JetStream: true,
		StoreDir:  storeDir,
		NoLog:     true,
		NoSigs:    true,
		// Events travel as one message each: the largest must fit.
		MaxPayload: contract.MaxMessageBytes,
	})
	if err != nil {
		return nil, fmt.Errorf("testenv: configure nats-server: %w", err)
	}
	go ns.Start()
	if !ns.ReadyForConnections(10 * time.Second) {
		ns.Shutdown()
		ns.WaitForShutdown()
		return nil, errors.New("testenv: nats-server not ready within 10s")
	}
	addr, ok := ns.Addr().(*net.TCPAddr)
	if !ok {
		ns.Shutdown()
		ns.WaitForShutdown()
		return nil, fmt.Errorf("testenv: unexpected nats-server address %v", ns.Addr())
	}
	return &NATS{Server: ns, URL: ns.ClientURL(), StoreDir: storeDir, Port: addr.Port}, nil
}

// Shutdown stops the server and waits until it has released its port and
// store; it is safe to call more than once.
func (n *NATS) Shutdown() {
	n.once.Do(func() {
		n.Server.Shutdown()
		n.Server.WaitForShutdown()
	})
}

// Connect opens a client connection that is closed when the test ends.
func (n *NATS) Connect(t testing.TB) *nats.Conn {
	t.Helper()
	nc, err := nats.Connect(n.URL, nats.Name(t.Name()))
	if err != nil {
		t.Fatalf("testenv: connect to NATS at %s: %v", n.URL, err)
	}
	t.Cleanup(nc.Close)
	return nc
}
