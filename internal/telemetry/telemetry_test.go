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
	code, b := body("/metrics")
	if code != 200 {
		t.Fatalf("/metrics: %d", code)
	}
	m, err := telemetry.Parse(strings.NewReader(b))
	if err != nil {
		t.Fatal(err)
	}
	if v, err := m.Value("converge_test_total", nil); err != nil || v != 3 {
		t.Errorf("converge_test_total = %v, %v; want 3", v, err)
	}
	if _, err := m.Value("go_goroutines", nil); err != nil {
		t.Errorf("the Go runtime's metrics: %v", err)
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
