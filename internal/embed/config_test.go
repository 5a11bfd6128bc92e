package embed

import (
	"strings"
	"testing"
)

func TestNew(t *testing.T) {
	for _, tc := range []struct {
		name string
		cfg  Config
		want string // the embedder's Name, or part of the error
		dim  int    // 0: an error
	}{
		{"hash by default", Config{}, "converge.hash.v1/256", 256},
		{"hash dimension", Config{Dimension: 512}, "converge.hash.v1/512", 512},
		{"hash dimension too small", Config{Dimension: 4}, "outside [8, 4096]", 0},
		{"model without URL", Config{Model: "text-embedding-3-small"}, "without the URL", 0},
		{"API key without URL", Config{APIKey: "sk-1"}, "without the URL", 0},
		{"endpoint", Config{URL: "https://api.openai.com", Model: "text-embedding-3-small", APIKey: "sk-1", Dimension: 1536},
			"text-embedding-3-small", 1536},
		{"URL without model", Config{URL: "https://api.openai.com", Dimension: 1536}, "no model", 0},
		{"URL without dimension", Config{URL: "https://api.openai.com", Model: "text-embedding-3-small"},
			`dimension of model "text-embedding-3-small" is not configured`, 0},
		{"URL not http", Config{URL: "api.openai.com", Model: "m", Dimension: 8}, "not an http or https URL", 0},
		{"batch and concurrency", Config{URL: "http://127.0.0.1:1", Model: "m", Dimension: 8, BatchSize: 128, Concurrency: 16}, "m", 8},
		{"batch without URL", Config{BatchSize: 32}, "batch size or concurrency is configured without the URL", 0},
		{"batch too large", Config{URL: "http://127.0.0.1:1", Model: "m", Dimension: 8, BatchSize: 4096}, "batch size 4096: it must be from 1 to 2048", 0},
		{"negative concurrency", Config{URL: "http://127.0.0.1:1", Model: "m", Dimension: 8, Concurrency: -1}, "concurrency -1: it must be from 1 to 256", 0},
	} {
		e, err := New(tc.cfg)
		if tc.dim == 0 {
			if err == nil || !strings.Contains(err.Error(), tc.want) {
				t.Errorf("%s: error %v, want one with %q", tc.name, err, tc.want)
			}
			if e != nil {
				t.Errorf("%s: an embedder with the error", tc.name)
			}
			if verr := tc.cfg.Validate(); verr == nil || verr.Error() != err.Error() {
				t.Errorf("%s: Validate = %v, New = %v", tc.name, verr, err)
			}
			continue
		}
		if err != nil {
			t.Errorf("%s: %v", tc.name, err)
			continue
		}
		if e.Name() != tc.want || e.Dimension() != tc.dim {
			t.Errorf("%s: %q of dimension %d, want %q of %d", tc.name, e.Name(), e.Dimension(), tc.want, tc.dim)
		}
		_, isHTTP := e.(*HTTP)
		if isHTTP != (tc.cfg.URL != "") {
			t.Errorf("%s: %T", tc.name, e)
		}
	}
}
