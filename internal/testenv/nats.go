package testenv

import (
	"context"
	"fmt"
	"testing"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/converge-sync/converge/internal/natsserver"
	"github.com/converge-sync/converge/pkg/contract"
)

// NATS is an embedded nats-server with JetStream and a file store.
type NATS struct {
	*natsserver.Server
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
	s, err := natsserver.Start(storeDir, port)
	if err != nil {
		return nil, fmt.Errorf("testenv: %w", err)
	}
	return &NATS{Server: s}, nil
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

// DocsStream connects to n and creates the documents' stream (CONVERGE_DOCS
// on converge.docs.>, file storage) as the relay would.
func (n *NATS) DocsStream(t testing.TB) (*nats.Conn, jetstream.JetStream) {
	t.Helper()
	nc := n.Connect(t)
	js, err := jetstream.New(nc)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := js.CreateStream(context.Background(), jetstream.StreamConfig{Name: contract.DocsStream,
		Subjects: []string{contract.DocsSubjectPrefix + ">"}, Storage: jetstream.FileStorage}); err != nil {
		t.Fatalf("testenv: create the stream CONVERGE_DOCS: %v", err)
	}
	return nc, js
}
