//go:build linux

package partition_test

import (
	"bufio"
	"fmt"
	"io"
	"net"
	"net/http"
	"os"
	"strconv"
	"strings"
	"sync"
	"time"

	"github.com/converge-sync/converge/internal/notifier"
)

// post is one request the webhook receiver got.
type post struct {
	At      time.Time
	Key     string // Idempotency-Key
	EventID string // Converge-Event-Id
	Sender  string // the notifier instance whose socket sent it ("?": unknown)
	Valid   bool   // signed with the run's secret
}

// receiver is the notifiers' webhook receiver on 127.0.0.1. Both
// instances post to its one URL (an effect's identity, and its key,
// depend on the URL), so it tells them apart by the connection: the
// instance whose process holds the client's socket (/proc), found when
// the connection is accepted. It answers 200 after delay.
type receiver struct {
	srv    *http.Server
	url    string
	port   int
	secret []byte
	delay  time.Duration

	mu      sync.Mutex
	senders map[int]string    // pid -> instance
	conns   map[string]string // remote address -> instance
	posts   []post
}

func startReceiver(secret []byte, delay time.Duration) (*receiver, error) {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return nil, err
	}
	r := &receiver{url: "http://" + ln.Addr().String() + "/hook", port: ln.Addr().(*net.TCPAddr).Port, secret: secret,
		delay: delay, senders: map[int]string{}, conns: map[string]string{}}
	r.srv = &http.Server{Handler: r, ReadHeaderTimeout: 10 * time.Second, ConnState: r.connState}
	go func() { _ = r.srv.Serve(ln) }()
	return r, nil
}

// sender names the process pid as an instance.
func (r *receiver) sender(pid int, name string) {
	r.mu.Lock()
	defer r.mu.Unlock()
	r.senders[pid] = name
}

func (r *receiver) connState(c net.Conn, s http.ConnState) {
	if s != http.StateNew {
		return
	}
	r.mu.Lock()
	pids := make(map[int]string, len(r.senders))
	for pid, name := range r.senders {
		pids[pid] = name
	}
	r.mu.Unlock()
	owner := socketOwner(c.RemoteAddr().(*net.TCPAddr).Port, r.port, pids)
	r.mu.Lock()
	r.conns[c.RemoteAddr().String()] = owner
	r.mu.Unlock()
}

func (r *receiver) ServeHTTP(w http.ResponseWriter, req *http.Request) {
	body, err := io.ReadAll(req.Body)
	p := post{At: time.Now(), Key: req.Header.Get(notifier.HeaderIdempotencyKey), EventID: req.Header.Get(notifier.HeaderEventID)}
	p.Valid = err == nil && req.Method == http.MethodPost &&
		notifier.Sign(r.secret, req.Header.Get(notifier.HeaderTimestamp), body) == req.Header.Get(notifier.HeaderSignature)
	r.mu.Lock()
	p.Sender = r.conns[req.RemoteAddr]
	r.posts = append(r.posts, p)
	r.mu.Unlock()
	time.Sleep(r.delay)
	if !p.Valid {
		w.WriteHeader(http.StatusBadRequest)
	}
}

func (r *receiver) received() []post {
	r.mu.Lock()
	defer r.mu.Unlock()
	return append([]post(nil), r.posts...)
}

// from is what instance sent, as landings: every POST changes the
// receiver's world.
func (r *receiver) from(instance string) []landing {
	var out []landing
	for _, p := range r.received() {
		if p.Sender == instance {
			out = append(out, landing{At: p.At, What: "POST " + p.Key, Write: true})
		}
	}
	return out
}

func (r *receiver) close() { _ = r.srv.Close() }

// socketOwner is the instance among pids whose process holds the TCP
// socket 127.0.0.1:port connected to server, "?" when none does.
func socketOwner(port, server int, pids map[int]string) string {
	inode := socketInode(port, server)
	if inode == "" {
		return "?"
	}
	want := "socket:[" + inode + "]"
	for pid, name := range pids {
		dir := fmt.Sprintf("/proc/%d/fd", pid)
		fds, err := os.ReadDir(dir)
		if err != nil {
			continue
		}
		for _, fd := range fds {
			if l, err := os.Readlink(dir + "/" + fd.Name()); err == nil && l == want {
				return name
			}
		}
	}
	return "?"
}

// socketInode is the inode of the IPv4 socket from 127.0.0.1:port to
// 127.0.0.1:server in /proc/net/tcp ("" if there is none).
func socketInode(port, server int) string {
	f, err := os.Open("/proc/net/tcp")
	if err != nil {
		return ""
	}
	defer f.Close()
	local := fmt.Sprintf("0100007F:%04X", port)
	remote := fmt.Sprintf("0100007F:%04X", server)
	sc := bufio.NewScanner(f)
	for sc.Scan() {
		fields := strings.Fields(sc.Text())
		if len(fields) > 9 && fields[1] == local && fields[2] == remote {
			if _, err := strconv.ParseUint(fields[9], 10, 64); err == nil {
				return fields[9]
			}
		}
	}
	return ""
}
