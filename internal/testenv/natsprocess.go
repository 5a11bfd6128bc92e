package testenv

import (
	"fmt"
	"io"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/nats-io/nats-server/v2/server"

	"github.com/converge-sync/converge/internal/localaddr"
	"github.com/converge-sync/converge/internal/natsserver"

	"github.com/converge-sync/converge/internal/proc"
	"github.com/converge-sync/converge/pkg/contract"
)

// BuildNATSServer builds the nats-server command of the module's own
// nats-server/v2 dependency (the version go.mod pins) into a temporary
// directory of t and returns its path: a server a test can SIGKILL and
// restart, which an embedded one cannot be.
func BuildNATSServer(t testing.TB) string {
	t.Helper()
	root, err := moduleRoot()
	if err != nil {
		t.Fatalf("testenv: %v", err)
	}
	path := filepath.Join(t.TempDir(), "nats-server")
	cmd := exec.Command("go", "build", "-trimpath", "-o", path, "github.com/nats-io/nats-server/v2")
	cmd.Dir = root
	cmd.Env = append(os.Environ(), "CGO_ENABLED=0")
	if out, err := cmd.CombinedOutput(); err != nil {
		t.Fatalf("testenv: go build nats-server: %v\n%s", err, out)
	}
	return path
}

// NATSProcessOptions are the settings of a server that [StartNATSProcess]
// starts.
type NATSProcessOptions struct {
	// StoreDir keeps the JetStream store; empty: a temporary directory
	// of the test.
	StoreDir string
	// Users are the only clients admitted, each with its permissions
	// (natsauth.Users); a user whose Permissions are nil may do anything.
	// None: every client is admitted.
	Users []*server.User
	// Out receives the server's log; nil: discarded.
	Out io.Writer

	// name, clusterPort and routes make the server a node of a cluster
	// (StartNATSCluster).
	name        string
	clusterPort int
	routes      []int
}

// NATSProcess is a nats-server with JetStream running as a child process
// on 127.0.0.1, with a file store: Kill and Start again are a crash and a
// restart on the same store and port.
type NATSProcess struct {
	URL      string // nats://127.0.0.1:PORT
	Port     int
	StoreDir string
	Name     string // the server's name in a cluster; "" for a single server

	bin, conf   string
	monitorPort int
	out         io.Writer

	mu    sync.Mutex
	child *proc.Child
}

// StartNATSProcess writes the configuration of a server (o) and starts it
// from bin (see [BuildNATSServer]), returning once JetStream is ready. The
// server is SIGKILLed when t ends.
func StartNATSProcess(t testing.TB, bin string, o NATSProcessOptions) *NATSProcess {
	t.Helper()
	if o.StoreDir == "" {
		o.StoreDir = t.TempDir()
	}
	port, err := freeTCPPort()
	if err != nil {
		t.Fatalf("testenv: %v", err)
	}
	monitor, err := freeTCPPort()
	if err != nil {
		t.Fatalf("testenv: %v", err)
	}
	n := &NATSProcess{URL: fmt.Sprintf("nats://127.0.0.1:%d", port), Port: port, StoreDir: o.StoreDir, Name: o.name,
		bin: bin, conf: filepath.Join(t.TempDir(), "nats-server.conf"), monitorPort: monitor, out: o.Out}
	conf := natsConf(port, monitor, o.StoreDir, o.Users)
	if o.name != "" {
		conf = clusterConf(o.name, o.clusterPort, o.routes) + conf
	}
	if err := os.WriteFile(n.conf, []byte(conf), 0o600); err != nil {
		t.Fatalf("testenv: %v", err)
	}
	t.Cleanup(n.Kill)
	if o.name != "" {
		return n // StartNATSCluster starts the nodes together
	}
	if err := n.Start(); err != nil {
		t.Fatalf("testenv: %v", err)
	}
	return n
}

// NATSCluster is a JetStream cluster of nats-server processes on
// 127.0.0.1, each on its own store: a node's Kill and Start are a crash
// and a restart of that server.
type NATSCluster struct {
	Nodes []*NATSProcess
	// URL lists every node's client URL, comma-separated: what a client
	// connects to.
	URL string
}

// StartNATSCluster starts a cluster of size nodes (3 for quorum with one
// down) with o's users and log, and returns once every node is ready.
func StartNATSCluster(t testing.TB, bin string, size int, o NATSProcessOptions) *NATSCluster {
	t.Helper()
	ports := make([]int, size)
	for i := range ports {
		p, err := freeTCPPort()
		if err != nil {
			t.Fatalf("testenv: %v", err)
		}
		ports[i] = p
	}
	c := &NATSCluster{}
	urls := make([]string, size)
	for i := range size {
		no := o
		no.StoreDir = t.TempDir()
		no.name, no.clusterPort = fmt.Sprintf("n%d", i+1), ports[i]
		for j, p := range ports {
			if j != i {
				no.routes = append(no.routes, p)
			}
		}
		n := StartNATSProcess(t, bin, no)
		c.Nodes = append(c.Nodes, n)
		urls[i] = n.URL
	}
	c.URL = strings.Join(urls, ",")
	errs := make(chan error, size)
	for _, n := range c.Nodes {
		go func() { errs <- n.Start() }()
	}
	for range size {
		if err := <-errs; err != nil {
			t.Fatalf("testenv: cluster: %v", err)
		}
	}
	return c
}

// Node is the node called name, nil when none is.
func (c *NATSCluster) Node(name string) *NATSProcess {
	for _, n := range c.Nodes {
		if n.Name == name {
			return n
		}
	}
	return nil
}

// clusterConf is the part of a node's configuration that makes it one of
// the cluster: its name, its route port and the others'.
func clusterConf(name string, port int, routes []int) string {
	var b strings.Builder
	fmt.Fprintf(&b, "server_name: %s\ncluster {\n  name: converge\n  listen: \"127.0.0.1:%d\"\n  routes: [\n", strconv.Quote(name), port)
	for _, r := range routes {
		fmt.Fprintf(&b, "    \"nats-route://127.0.0.1:%d\"\n", r)
	}
	b.WriteString("  ]\n}\n")
	return b.String()
}

// Start starts the server (again, after Kill) on its store and port and
// waits until JetStream has recovered its streams and is ready (at most a
// minute). It is a no-op while the server runs.
func (n *NATSProcess) Start() error {
	n.mu.Lock()
	defer n.mu.Unlock()
	if n.child != nil && !n.child.Exited() {
		return nil
	}
	deadline := time.Now().Add(time.Minute)
	for {
		c, err := proc.Start(n.bin, []string{"-c", n.conf}, proc.Options{Out: n.out})
		if err != nil {
			return fmt.Errorf("start nats-server: %w", err)
		}
		n.child = c
		for !c.Exited() && time.Now().Before(deadline) {
			if n.healthy() {
				return nil
			}
			time.Sleep(20 * time.Millisecond)
		}
		if !c.Exited() {
			c.Kill()
			return fmt.Errorf("nats-server on port %d not ready within a minute", n.Port)
		}
		// The port of the killed server may not be free yet: try again.
		if time.Now().After(deadline) {
			return fmt.Errorf("nats-server on port %d: %w", n.Port, c.Err())
		}
		time.Sleep(200 * time.Millisecond)
	}
}

// Healthy is the server's own health check with JetStream, as a
// supervisor's liveness probe reads it.
func (n *NATSProcess) Healthy() bool { return n.healthy() }

// healthy is the server's own health check with JetStream: streams
// recovered, meta layer current.
func (n *NATSProcess) healthy() bool {
	c := http.Client{Timeout: time.Second}
	resp, err := c.Get(fmt.Sprintf("http://127.0.0.1:%d/healthz?js-enabled-only=true", n.monitorPort))
	if err != nil {
		return false
	}
	_ = resp.Body.Close()
	return resp.StatusCode == http.StatusOK
}

// Kill SIGKILLs the server (a crash: what it has not written to its files
// is lost, what the OS holds is not) and waits until it is reaped.
func (n *NATSProcess) Kill() {
	n.mu.Lock()
	defer n.mu.Unlock()
	if n.child != nil {
		n.child.Kill()
		n.child = nil
	}
}

// Pid is the running server's process id, 0 when it is not running.
func (n *NATSProcess) Pid() int {
	n.mu.Lock()
	defer n.mu.Unlock()
	if n.child == nil || n.child.Exited() {
		return 0
	}
	return n.child.Pid()
}

// natsConf is the configuration file of a server on 127.0.0.1:port with
// its monitoring on monitor, its store in storeDir, admitting users alone.
func natsConf(port, monitor int, storeDir string, users []*server.User) string {
	var b strings.Builder
	fmt.Fprintf(&b, "host: \"127.0.0.1\"\nport: %d\nhttp: \"127.0.0.1:%d\"\n", port, monitor)
	// Events travel as one message each: the largest must fit.
	fmt.Fprintf(&b, "max_payload: %d\n", contract.MaxMessageBytes)
	fmt.Fprintf(&b, "jetstream {\n  store_dir: %s\n}\n", strconv.Quote(storeDir))
	if len(users) == 0 {
		return b.String()
	}
	b.WriteString(natsserver.UsersConf(users))
	return b.String()
}

// freeTCPPort is a port the server keeps across its restarts: one that
// no outgoing connection of the machine is given while it is down.
func freeTCPPort() (int, error) { return localaddr.FreePort() }
