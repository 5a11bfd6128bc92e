// Package natsserver runs a real NATS server with JetStream inside the
// process, on 127.0.0.1: what `converge dev` and `converge demo` use when no
// NATS URL is configured, and what the tests run against.
package natsserver

import (
	"errors"
	"fmt"
	"net"
	"strings"
	"sync"
	"time"

	"github.com/nats-io/nats-server/v2/server"

	"github.com/converge-sync/converge/pkg/contract"
)

// Server is an embedded nats-server with JetStream and a file store.
type Server struct {
	Server   *server.Server
	URL      string
	StoreDir string
	// Port is the bound client port; pass it to Start again to restart the
	// server where clients expect it.
	Port int

	once sync.Once
}

// Options of a server started by [StartWith].
type Options struct {
	// StoreDir keeps the JetStream store.
	StoreDir string
	// Port is the client port on 127.0.0.1; -1 or 0: a free port.
	Port int
	// Users are the only clients the server admits, each with its
	// permissions (natsauth.Users); nil: every client is admitted and may
	// do anything.
	Users []*server.User
	// Nkeys are clients admitted by an nkey signature, each with its
	// permissions, besides Users.
	Nkeys []*server.NkeyUser
}

// Start starts a server with its JetStream store in storeDir, listening on
// 127.0.0.1:port (-1 or 0: a free port), admitting every client. Starting
// again on the store dir and port of a stopped server is a restart:
// streams and messages persist.
func Start(storeDir string, port int) (*Server, error) {
	return StartWith(Options{StoreDir: storeDir, Port: port})
}

// StartWith starts a server as o says; like [Start], starting again on a
// stopped server's store dir and port is a restart.
func StartWith(o Options) (*Server, error) {
	port := o.Port
	if port == 0 {
		port = -1
	}
	ns, err := server.NewServer(&server.Options{
		Host:      "127.0.0.1",
		Port:      port,
		JetStream: true,
		StoreDir:  o.StoreDir,
		NoLog:     true,
		NoSigs:    true,
		// Events travel as one message each: the largest must fit.
		MaxPayload: contract.MaxMessageBytes,
		Users:      o.Users,
		Nkeys:      o.Nkeys,
	})
	if err != nil {
		return nil, fmt.Errorf("configure nats-server: %w", err)
	}
	go ns.Start()
	if !ns.ReadyForConnections(10 * time.Second) {
		ns.Shutdown()
		ns.WaitForShutdown()
		return nil, errors.New("nats-server not ready within 10s")
	}
	addr, ok := ns.Addr().(*net.TCPAddr)
	if !ok {
		ns.Shutdown()
		ns.WaitForShutdown()
		return nil, fmt.Errorf("unexpected nats-server address %v", ns.Addr())
	}
	return &Server{Server: ns, URL: ns.ClientURL(), StoreDir: o.StoreDir, Port: addr.Port}, nil
}

// Shutdown stops the server and waits until it has released its port and
// store; it is safe to call more than once.
func (s *Server) Shutdown() {
	s.once.Do(func() {
		s.Server.Shutdown()
		s.Server.WaitForShutdown()
	})
}

// UsersConf is the nats-server configuration block admitting users alone,
// each with its password (or bcrypt hash) and permissions
// (natsauth.Users): what a server's configuration file includes (the
// compose stack's, deploy/secretgen; a test server run as a process,
// internal/testenv).
func UsersConf(users []*server.User) string {
	var b strings.Builder
	b.WriteString("authorization {\n  users = [\n")
	for _, u := range users {
		fmt.Fprintf(&b, "    {\n      user: %q\n      password: %q\n", u.Username, u.Password)
		if p := u.Permissions; p != nil {
			b.WriteString("      permissions: {\n")
			for _, side := range []struct {
				name string
				sp   *server.SubjectPermission
			}{{"publish", p.Publish}, {"subscribe", p.Subscribe}} {
				if side.sp == nil {
					continue
				}
				fmt.Fprintf(&b, "        %s: {\n", side.name)
				for _, list := range []struct {
					name     string
					subjects []string
				}{{"allow", side.sp.Allow}, {"deny", side.sp.Deny}} {
					if len(list.subjects) == 0 {
						continue
					}
					fmt.Fprintf(&b, "          %s: [\n", list.name)
					for _, s := range list.subjects {
						fmt.Fprintf(&b, "            %q\n", s)
					}
					b.WriteString("          ]\n")
				}
				b.WriteString("        }\n")
			}
			b.WriteString("      }\n")
		}
		b.WriteString("    }\n")
	}
	b.WriteString("  ]\n}\n")
	return b.String()
}
