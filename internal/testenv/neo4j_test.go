package testenv

import (
	"context"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/neo4j/neo4j-go-driver/v5/neo4j"
)

// A lease is exclusive across processes: the second lease of a pool of
// one instance waits until the first is released, and a lease held by
// another process (here a flock child) is not taken.
func TestNeo4jLeaseIsExclusive(t *testing.T) {
	t.Parallel()
	p := &neo4jPool{urls: []string{"bolt://127.0.0.1:1"}, lockDir: t.TempDir()}
	_, release, err := p.lease(t)
	if err != nil {
		t.Fatal(err)
	}
	got := make(chan struct{})
	go func() {
		_, release2, err := p.lease(t)
		if err != nil {
			t.Error(err)
		} else {
			release2()
		}
		close(got)
	}()
	select {
	case <-got:
		t.Fatal("a second lease was granted while the first was held")
	case <-time.After(500 * time.Millisecond):
	}
	release()
	select {
	case <-got:
	case <-time.After(10 * time.Second):
		t.Fatal("the second lease was not granted after the first was released")
	}

	// Another process holds the lease file: flock(1) from util-linux.
	flock, err := exec.LookPath("flock")
	if err != nil {
		t.Skip("no flock command to hold a lease from another process")
	}
	// -o: the lock stays with flock itself, not with sleep, so killing
	// flock releases it.
	holder := exec.Command(flock, "-o", filepath.Join(p.lockDir, "lease-0"), "sleep", "30")
	if err := holder.Start(); err != nil {
		t.Fatal(err)
	}
	defer func() { _ = holder.Process.Kill(); _ = holder.Wait() }()
	Eventually(t, "the other process to hold the lease", 10*time.Second, func() bool {
		f, err := os.OpenFile(filepath.Join(p.lockDir, "lease-0"), os.O_RDWR, 0)
		if err != nil {
			return false
		}
		defer f.Close()
		return syscall.Flock(int(f.Fd()), syscall.LOCK_EX|syscall.LOCK_NB) != nil
	})
	taken := make(chan struct{})
	go func() {
		if _, release, err := p.lease(t); err == nil {
			release()
		}
		close(taken)
	}()
	select {
	case <-taken:
		t.Fatal("a lease held by another process was granted")
	case <-time.After(500 * time.Millisecond):
	}
	_ = holder.Process.Kill()
	<-taken
}

// The server stops, and removes its folder, when the process it watches
// dies by SIGKILL; until then it answers over Bolt with its credentials
// and refuses a wrong password.
func TestNeo4jServerStopsWhenItsParentIsKilled(t *testing.T) {
	t.Parallel()
	if testing.Short() {
		t.Skip("starts a Neo4j server")
	}
	parent := exec.Command("sleep", "600")
	if err := parent.Start(); err != nil {
		t.Fatal(err)
	}
	defer func() { _ = parent.Process.Kill(); _ = parent.Wait() }()
	p, err := startOwnNeo4j(1, "NEO4J_PARENT_PID="+strconv.Itoa(parent.Process.Pid))
	if err != nil {
		noNeo4j(t, err)
	}
	pidText, err := os.ReadFile(filepath.Join(p.lockDir, "server.pid"))
	if err != nil {
		t.Fatal(err)
	}
	pid, err := strconv.Atoi(strings.TrimSpace(string(pidText)))
	if err != nil {
		t.Fatal(err)
	}
	defer func() { _ = syscall.Kill(pid, syscall.SIGKILL) }()

	ctx := context.Background()
	for _, c := range []struct {
		password string
		ok       bool
	}{{p.password, true}, {"not-the-password", false}} {
		d, err := neo4j.NewDriverWithContext(p.urls[0], neo4j.BasicAuth(p.user, c.password, ""))
		if err != nil {
			t.Fatal(err)
		}
		err = d.VerifyConnectivity(ctx)
		_ = d.Close(ctx)
		if (err == nil) != c.ok {
			t.Errorf("connecting with password %q: %v; want ok %v", c.password, err, c.ok)
		}
	}

	_ = parent.Process.Kill()
	_ = parent.Wait()
	Eventually(t, "the server to stop after its parent's SIGKILL", 60*time.Second, func() bool {
		return syscall.Kill(pid, 0) != nil
	})
	Eventually(t, "the server's folder to be removed", 10*time.Second, func() bool {
		_, err := os.Stat(p.lockDir)
		return os.IsNotExist(err)
	})
}
