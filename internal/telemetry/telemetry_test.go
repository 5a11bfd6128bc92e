package telemetry_test

import (
	"context"
	"errors"
	"io"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync/atomic"
	"testing"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/converge-sync/converge/internal/telemetry"
)

func TestEndpoints(t *testing.T) {
	reg := telemetry.NewRegistry()
	c := prometheus.NewCounter(prometheus.CounterOpts{Name: "converge_test_total", Help: "test"})
	reg.MustRegister(c)
	c.Add(3)
	var down atomic.Bool
	down.Store(true)
	srv := httptest.NewServer(telemetry.Handler(reg, telemetry.Check{Name: "postgres", Func: func(context.Context) error {
		if down.Load() {
			return errors.New("postgres: connection refused")
		}
		return nil
	}}))
	defer srv.Close()
	body := func(path string) (int, string) {
		resp, err := http.Get(srv.URL + path)
		if err != nil {
			t.Fatal(err)
		}
		defer resp.Body.Close()
		b, _ := io.ReadAll(resp.Body)
		return resp.StatusCode, string(b)
	}
	if code, b := body("/metrics"); code != 200 || !strings.Contains(b, "converge_test_total 3") || !strings.Contains(b, "go_goroutines") {
		t.Fatalf("/metrics: %d", code)
	}
	if code, _ := body("/healthz"); code != 200 {
		t.Fatalf("/healthz: %d", code)
	}
	if code, b := body("/readyz"); code != 503 || !strings.Contains(b, "connection refused") {
		t.Fatalf("/readyz while failing: %d %s", code, b)
	}
	down.Store(false)
	if code, _ := body("/readyz"); code != 200 {
		t.Fatalf("/readyz when ready: %d", code)
	}
}
