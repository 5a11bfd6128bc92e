package testenv

import (
	"crypto/rand"
	"errors"
	"fmt"
	"net"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"
)

// QdrantTLS is an instance of the test Qdrant server of its own that
// serves its REST and gRPC APIs over TLS alone and takes API keys, with a
// collection name for its test.
type QdrantTLS struct {
	// Qdrant is the instance as the test's own tools reach it: URL and
	// HTTPURL are plain fronts on loopback (PlainFront) that forward over
	// TLS, so that the tests' helpers, which speak plain HTTP and gRPC,
	// work on it unchanged.
	Qdrant
	// TLSURL is the gRPC API as a client of the server connects to it,
	// https://127.0.0.1:PORT (the form of qdrant.Config.Addr that
	// implies TLS); TLSHTTPURL the REST API, https://127.0.0.1:PORT. Both
	// refuse plain connections.
	TLSURL, TLSHTTPURL string
	// Certs are the CA its certificate is signed by, and its key pair.
	Certs Certificates
}

// qdrantVersion is the release scripts/qdrant-server.sh installs.
const qdrantVersion = "1.16.3"

// StartQdrantTLS starts Qdrant's release binary (installed by
// scripts/qdrant-server.sh install when missing) for t alone, with TLS on
// both APIs (certs' key pair) and a random API key and read-only key, and
// stops it when t ends. It costs a server start (well under a second).
// Where the binary cannot be had, t is skipped (or fails with CI=true) as
// by LeaseQdrant.
func StartQdrantTLS(t testing.TB, certs Certificates) QdrantTLS {
	t.Helper()
	binary, err := repoFile(filepath.Join("bin", "qdrant-"+qdrantVersion, "qdrant"))
	if err != nil {
		noQdrant(t, err)
	}
	if _, err := os.Stat(binary); err != nil {
		script, err := repoFile("scripts/qdrant-server.sh")
		if err != nil {
			noQdrant(t, err)
		}
		if out, err := exec.Command("bash", script, "install").CombinedOutput(); err != nil {
			noQdrant(t, fmt.Errorf("%s install: %w: %s", script, err, strings.TrimSpace(lastLines(string(out), 5))))
		}
	}
	dir := t.TempDir()
	q := QdrantTLS{Certs: certs, Qdrant: Qdrant{APIKey: rand.Text(), ReadOnlyKey: rand.Text(),
		Collection: "t_" + strings.ToLower(rand.Text()[:16])}}
	// Another process may take a port between freeLoopbackPort and
	// Qdrant's bind: Qdrant then exits, and the start is tried again.
	for attempt := 1; ; attempt++ {
		stop, err := q.start(t, binary, dir, attempt)
		if err == nil {
			t.Cleanup(stop)
			break
		}
		if attempt == 5 || !errors.Is(err, errPortTaken) {
			t.Fatalf("testenv: Qdrant with TLS: %v", err)
		}
	}
	q.URL = PlainFront(t, certs, strings.TrimPrefix(q.TLSURL, "https://"), "h2")
	q.HTTPURL = "http://" + PlainFront(t, certs, strings.TrimPrefix(q.TLSHTTPURL, "https://"), "http/1.1")
	return q
}

// errPortTaken is a start that failed because a port was taken.
var errPortTaken = errors.New("a port was taken")

// start starts the binary on two free ports, with its files in dir, and
// waits until it answers; stop stops it.
func (q *QdrantTLS) start(t testing.TB, binary, dir string, attempt int) (stop func(), err error) {
	httpPort, grpcPort := freeLoopbackPort(t), freeLoopbackPort(t)
	logFile, err := os.Create(filepath.Join(dir, fmt.Sprintf("server-%d.log", attempt)))
	if err != nil {
		return nil, err
	}
	cmd := exec.Command(binary, "--disable-telemetry")
	cmd.Dir = dir // Qdrant writes .qdrant-initialized into its working directory
	cmd.Stdout, cmd.Stderr = logFile, logFile
	cmd.SysProcAttr = &syscall.SysProcAttr{Pdeathsig: syscall.SIGKILL} // gone with the test process, however it ends
	cmd.Env = append(withoutQdrantSettings(),
		"QDRANT__SERVICE__HOST=127.0.0.1",
		fmt.Sprintf("QDRANT__SERVICE__HTTP_PORT=%d", httpPort),
		fmt.Sprintf("QDRANT__SERVICE__GRPC_PORT=%d", grpcPort),
		"QDRANT__STORAGE__STORAGE_PATH="+filepath.Join(dir, "storage"),
		"QDRANT__STORAGE__SNAPSHOTS_PATH="+filepath.Join(dir, "snapshots"),
		"QDRANT__TELEMETRY_DISABLED=true",
		"QDRANT__SERVICE__ENABLE_TLS=true",
		"QDRANT__TLS__CERT="+q.Certs.CertFile,
		"QDRANT__TLS__KEY="+q.Certs.KeyFile,
		"QDRANT__SERVICE__API_KEY="+q.APIKey,
		"QDRANT__SERVICE__READ_ONLY_API_KEY="+q.ReadOnlyKey)
	if err := cmd.Start(); err != nil {
		_ = logFile.Close()
		return nil, err
	}
	exited := make(chan error, 1)
	go func() { exited <- cmd.Wait() }()
	q.TLSURL = fmt.Sprintf("https://127.0.0.1:%d", grpcPort)
	q.TLSHTTPURL = fmt.Sprintf("https://127.0.0.1:%d", httpPort)
	if err := q.waitReady(exited); err != nil {
		_ = cmd.Process.Kill()
		<-exited
		_ = logFile.Close()
		text, _ := os.ReadFile(logFile.Name())
		if strings.Contains(string(text), "Address already in use") {
			return nil, errPortTaken
		}
		return nil, fmt.Errorf("%w; its log:\n%s", err, lastLines(string(text), 20))
	}
	return func() {
		_ = cmd.Process.Signal(syscall.SIGTERM)
		select {
		case <-exited:
		case <-time.After(10 * time.Second):
			_ = cmd.Process.Kill()
			<-exited
		}
		_ = logFile.Close()
	}, nil
}

// waitReady waits until the REST API answers /readyz over TLS, verified
// against the CA, and the gRPC port accepts connections.
func (q QdrantTLS) waitReady(exited <-chan error) error {
	client := &http.Client{Timeout: 2 * time.Second, Transport: &http.Transport{TLSClientConfig: q.Certs.ClientTLS()}}
	defer client.CloseIdleConnections()
	deadline := time.Now().Add(60 * time.Second)
	for {
		select {
		case err := <-exited:
			return fmt.Errorf("exited before answering: %w", err)
		default:
		}
		if resp, err := client.Get(q.TLSHTTPURL + "/readyz"); err == nil {
			_ = resp.Body.Close()
			if resp.StatusCode == http.StatusOK {
				if c, err := net.DialTimeout("tcp", strings.TrimPrefix(q.TLSURL, "https://"), time.Second); err == nil {
					_ = c.Close()
					return nil
				}
			}
		}
		if time.Now().After(deadline) {
			return fmt.Errorf("no answer at %s within 60 s", q.TLSHTTPURL)
		}
		time.Sleep(20 * time.Millisecond)
	}
}

// freeLoopbackPort is a TCP port free on 127.0.0.1 a moment ago.
func freeLoopbackPort(t testing.TB) int {
	t.Helper()
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatalf("testenv: %v", err)
	}
	defer func() { _ = l.Close() }()
	return l.Addr().(*net.TCPAddr).Port
}

// withoutQdrantSettings is this process's environment without QDRANT__*
// variables: the instance is configured by its starter alone.
func withoutQdrantSettings() []string {
	var env []string
	for _, kv := range os.Environ() {
		if !strings.HasPrefix(kv, "QDRANT__") {
			env = append(env, kv)
		}
	}
	return env
}
