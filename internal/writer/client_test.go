package writer_test

import (
	"context"
	"errors"
	"fmt"
	"net/http"
	"net/http/httptest"
	"slices"
	"strings"
	"testing"

	"github.com/converge-sync/converge/internal/docstore"
	"github.com/converge-sync/converge/internal/writer"
	"github.com/converge-sync/converge/pkg/contract"
)

func TestClientReemits(t *testing.T) {
	ctx := context.Background()
	e := newEnv(t)
	var writes []docstore.Write
	for i := range 7 {
		writes = append(writes, docstore.Write{Doc: contract.Document{Key: fmt.Sprintf("doc-%02d", i), Version: int64(i + 1), Body: "body"}})
	}
	if _, err := e.store.Apply(ctx, writes); err != nil {
		t.Fatal(err)
	}
	c, err := writer.NewClient(" "+e.srv.URL+"/ ", nil)
	if err != nil {
		t.Fatal(err)
	}
	if c.URL() != e.srv.URL {
		t.Fatalf("URL %q, want %q", c.URL(), e.srv.URL)
	}

	res, err := c.ReemitKeys(ctx, []string{"doc-03", "nope", "doc-01"})
	if err != nil {
		t.Fatal(err)
	}
	if len(res.Reemitted) != 2 || res.Reemitted[0].Key != "doc-01" || res.Reemitted[0].Version != 2 ||
		res.Reemitted[0].EventID != contract.EventID("doc-01", 2, contract.KindUpserted) || res.Reemitted[1].Key != "doc-03" ||
		!slices.Equal(res.NotFound, []string{"nope"}) {
		t.Fatalf("re-emitted %+v", res)
	}

	var pages [][]string
	resume, err := c.ReemitAll(ctx, "doc-01", 2, func(r writer.ReemitResponse) {
		var keys []string
		for _, d := range r.Reemitted {
			keys = append(keys, d.Key)
		}
		pages = append(pages, keys)
	})
	if err != nil || resume != "" {
		t.Fatalf("all: resume %q, %v", resume, err)
	}
	if fmt.Sprint(pages) != "[[doc-02 doc-03] [doc-04 doc-05] [doc-06]]" {
		t.Fatalf("pages %v", pages)
	}

	// A document that cannot be reproduced stops the pages where they
	// resume, with the writer's code.
	if _, err := e.pool.Exec(ctx, `DELETE FROM chunks WHERE key = 'doc-05'`); err != nil {
		t.Fatal(err)
	}
	pages = nil
	resume, err = c.ReemitAll(ctx, "", 2, func(r writer.ReemitResponse) { pages = append(pages, nil) })
	var apiErr *writer.APIError
	if resume != "doc-03" || len(pages) != 2 || !errors.As(err, &apiErr) || apiErr.StatusCode != http.StatusInternalServerError ||
		apiErr.Code != "not_reproducible" || !errors.Is(err, docstore.ErrNotReproducible) || errors.Is(err, contract.ErrInvalid) ||
		apiErr.SafeToRetry() || !strings.Contains(err.Error(), `"doc-05"`) {
		t.Fatalf("all over an irreproducible document: resume %q after %d pages, %v", resume, len(pages), err)
	}

	// The writer's own refusals are invalid requests, with their codes.
	for _, tc := range []struct {
		req    writer.ReemitRequest
		status int
		code   string
	}{
		{writer.ReemitRequest{All: true, Keys: []string{"a"}}, http.StatusUnprocessableEntity, "invalid_request"},
		{writer.ReemitRequest{All: true, Limit: writer.MaxReemitKeys + 1}, http.StatusUnprocessableEntity, "invalid_limit"},
		{writer.ReemitRequest{Keys: []string{"bad\x01key"}}, http.StatusUnprocessableEntity, contract.CodeKeyControlChar},
	} {
		_, err := c.Reemit(ctx, tc.req)
		if !errors.As(err, &apiErr) || apiErr.StatusCode != tc.status || apiErr.Code != tc.code || !apiErr.Invalid() ||
			!errors.Is(err, contract.ErrInvalid) || errors.Is(err, docstore.ErrNotFound) {
			t.Errorf("%+v: %v, want %d %s", tc.req, err, tc.status, tc.code)
		}
	}
	ctx2, cancel := context.WithCancel(ctx)
	cancel()
	if resume, err := c.ReemitAll(ctx2, "doc-02", 2, nil); resume != "doc-02" || !errors.Is(err, context.Canceled) {
		t.Fatalf("an interrupted re-emission: resume %q, %v", resume, err)
	}
}

func TestClientErrors(t *testing.T) {
	ctx := context.Background()
	for _, u := range []string{"127.0.0.1:8080", "ftp://x", ""} {
		if _, err := writer.NewClient(u, nil); err == nil || !strings.Contains(err.Error(), "http://host:port") {
			t.Errorf("NewClient(%q): %v", u, err)
		}
	}
	c, err := writer.NewClient("http://127.0.0.1:1", nil)
	if err != nil {
		t.Fatal(err)
	}
	var apiErr *writer.APIError
	if _, err := c.ReemitKeys(ctx, []string{"a"}); err == nil || errors.As(err, &apiErr) || !strings.Contains(err.Error(), "does not answer") {
		t.Fatalf("no writer: %v", err)
	}
	// An answer that is not the API's error keeps its status and body.
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, _ *http.Request) {
		http.Error(w, "the proxy is down", http.StatusBadGateway)
	}))
	defer srv.Close()
	c, _ = writer.NewClient(srv.URL, nil)
	_, err = c.Reemit(ctx, writer.ReemitRequest{Keys: []string{"a"}})
	if !errors.As(err, &apiErr) || apiErr.StatusCode != http.StatusBadGateway || apiErr.Code != "" || apiErr.Invalid() ||
		!strings.Contains(err.Error(), "502 Bad Gateway: the proxy is down") {
		t.Fatalf("a proxy's error: %v", err)
	}
	// 503: nothing was written, retry later.
	srv503 := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, _ *http.Request) {
		w.Header().Set("Content-Type", "application/json")
		w.WriteHeader(http.StatusServiceUnavailable)
		fmt.Fprint(w, `{"error":{"code":"store_unavailable","message":"the document store is unavailable"}}`)
	}))
	defer srv503.Close()
	c, _ = writer.NewClient(srv503.URL, nil)
	if _, err := c.Reemit(ctx, writer.ReemitRequest{Keys: []string{"a"}}); !errors.As(err, &apiErr) || !apiErr.SafeToRetry() || apiErr.Code != "store_unavailable" {
		t.Fatalf("503: %v", err)
	}
}
