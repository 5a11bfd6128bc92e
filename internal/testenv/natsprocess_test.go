package testenv

import (
	"context"
	"testing"
	"time"

	"github.com/nats-io/nats-server/v2/server"
	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
)

// A server process admits its users alone, enforces their permissions,
// and keeps its streams across a SIGKILL and a restart on its store and
// port.
func TestNATSProcessSurvivesKill(t *testing.T) {
	if testing.Short() {
		t.Skip("builds and runs nats-server")
	}
	t.Parallel()
	n := StartNATSProcess(t, BuildNATSServer(t), NATSProcessOptions{Users: []*server.User{
		{Username: "admin", Password: "a-secret"},
		{Username: "limited", Password: "b-secret", Permissions: &server.Permissions{
			Publish: &server.SubjectPermission{Allow: []string{"allowed.>"}}}},
	}})
	if _, err := nats.Connect(n.URL, nats.UserInfo("admin", "wrong")); err == nil {
		t.Fatal("a wrong password was admitted")
	}
	connect := func(user, pw string, opts ...nats.Option) *nats.Conn {
		nc, err := nats.Connect(n.URL, append(opts, nats.UserInfo(user, pw))...)
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(nc.Close)
		return nc
	}
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	js, err := jetstream.New(connect("admin", "a-secret", nats.MaxReconnects(-1), nats.ReconnectWait(50*time.Millisecond)))
	if err != nil {
		t.Fatal(err)
	}
	if _, err := js.CreateStream(ctx, jetstream.StreamConfig{Name: "S", Subjects: []string{"allowed.>", "denied.>"}}); err != nil {
		t.Fatal(err)
	}
	denied := make(chan error, 1)
	limited := connect("limited", "b-secret", nats.ErrorHandler(func(_ *nats.Conn, _ *nats.Subscription, err error) {
		select {
		case denied <- err:
		default:
		}
	}))
	if err := limited.Publish("denied.x", nil); err != nil {
		t.Fatal(err)
	}
	select {
	case <-denied:
	case <-time.After(10 * time.Second):
		t.Fatal("a publish beyond the user's permissions was not refused")
	}
	if _, err := js.Publish(ctx, "allowed.x", []byte("kept")); err != nil {
		t.Fatal(err)
	}

	pid := n.Pid()
	n.Kill()
	if n.Pid() != 0 {
		t.Fatal("the server runs after Kill")
	}
	if err := n.Start(); err != nil {
		t.Fatal(err)
	}
	if n.Pid() == 0 || n.Pid() == pid {
		t.Fatalf("pid %d after the restart, %d before", n.Pid(), pid)
	}
	s, err := js.Stream(ctx, "S")
	if err != nil {
		t.Fatal(err)
	}
	m, err := s.GetLastMsgForSubject(ctx, "allowed.x")
	if err != nil || string(m.Data) != "kept" {
		t.Fatalf("after the restart: %v %v", m, err)
	}
}
