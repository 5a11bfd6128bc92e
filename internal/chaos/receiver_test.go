//go:build linux

package chaos

import (
	"encoding/json"
	"io"
	"math/rand/v2"
	"net"
	"net/http"
	"sync"
	"time"

	"github.com/google/uuid"

	"github.com/converge-sync/converge/internal/notifier"
)

// delivery is one request the receiver got.
type delivery struct {
	At      time.Time
	Key     string // Idempotency-Key
	Status  int    // what the receiver answered
	EventID uuid.UUID
	DocKey  string
	Version int64
	Valid   bool // signed with the run's secret, a notification body
}

// receiver is the webhook receiver of the notifier, on 127.0.0.1: it
// records every request, and answers 503 to a seeded fraction of them so
// that retries are exercised; every other request gets 200, a repeat of
// an effect already answered 2xx too (a receiver that deduplicates on the
// key answers a repeat as it answered the first). With a delay it is a
// slow receiver, which makes the notifier fall behind the writers.
type receiver struct {
	srv    *http.Server
	url    string
	secret []byte

	delay time.Duration // before each answer

	mu   sync.Mutex
	rng  *rand.Rand
	fail float64
	reqs []delivery
}

func startReceiver(secret []byte, seed uint64, fail float64, delay time.Duration) (*receiver, error) {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return nil, err
	}
	r := &receiver{secret: secret, rng: rand.New(rand.NewPCG(seed, 0x5eed)), fail: fail, delay: delay, url: "http://" + ln.Addr().String() + "/hook"}
	r.srv = &http.Server{Handler: r, ReadHeaderTimeout: 10 * time.Second}
	go func() { _ = r.srv.Serve(ln) }()
	return r, nil
}

func (r *receiver) ServeHTTP(w http.ResponseWriter, req *http.Request) {
	body, err := io.ReadAll(req.Body)
	if r.delay > 0 {
		time.Sleep(r.delay)
	}
	d := delivery{At: time.Now(), Key: req.Header.Get("Idempotency-Key")}
	var n notifier.Notification
	if err == nil && json.Unmarshal(body, &n) == nil {
		d.EventID, d.DocKey, d.Version = n.EventID, n.Key, n.Version
		d.Valid = req.Method == http.MethodPost &&
			notifier.Sign(r.secret, req.Header.Get("Converge-Timestamp"), body) == req.Header.Get("Converge-Signature")
	}
	r.mu.Lock()
	d.Status = http.StatusOK
	if !d.Valid {
		d.Status = http.StatusBadRequest
	} else if r.rng.Float64() < r.fail {
		d.Status = http.StatusServiceUnavailable
	}
	r.reqs = append(r.reqs, d)
	r.mu.Unlock()
	w.WriteHeader(d.Status)
}

func (r *receiver) deliveries() []delivery {
	r.mu.Lock()
	defer r.mu.Unlock()
	return append([]delivery(nil), r.reqs...)
}

func (r *receiver) count() int {
	r.mu.Lock()
	defer r.mu.Unlock()
	return len(r.reqs)
}

func (r *receiver) close() { _ = r.srv.Close() }
