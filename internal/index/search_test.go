package index_test

import (
	"context"
	"encoding/json"
	"net/http"
	"net/http/httptest"
	"net/url"
	"testing"

	"github.com/converge-sync/converge/internal/embed"
	"github.com/converge-sync/converge/internal/index"
	"github.com/converge-sync/converge/internal/index/embedded"
	"github.com/converge-sync/converge/pkg/contract"
)

func TestSearchHandler(t *testing.T) {
	store, err := embedded.Open(t.TempDir(), embedded.Options{})
	if err != nil {
		t.Fatal(err)
	}
	defer store.Close()
	e, err := embed.NewHash(64)
	if err != nil {
		t.Fatal(err)
	}
	x, err := index.New(context.Background(), store, e, index.Options{})
	if err != nil {
		t.Fatal(err)
	}
	var events []*contract.Event
	for _, d := range []contract.Document{
		{Key: "sun", Version: 1, Title: "Sun", Body: "The sun is a star at the centre of the solar system."},
		{Key: "sea", Version: 2, Title: "Sea", Body: "Salt water covers most of the planet's surface."},
	} {
		d, err := d.Normalize()
		if err != nil {
			t.Fatal(err)
		}
		ev := contract.NewUpsertedEvent(d, []string{d.Body})
		events = append(events, &ev)
	}
	for _, r := range x.Apply(context.Background(), events) {
		if r.Err != nil {
			t.Fatal(r.Err)
		}
	}
	srv := httptest.NewServer(index.SearchHandler(x))
	defer srv.Close()
	get := func(q url.Values) (int, map[string]json.RawMessage) {
		t.Helper()
		resp, err := http.Get(srv.URL + "/v1/search?" + q.Encode())
		if err != nil {
			t.Fatal(err)
		}
		defer resp.Body.Close()
		var body map[string]json.RawMessage
		if err := json.NewDecoder(resp.Body).Decode(&body); err != nil {
			t.Fatal(err)
		}
		return resp.StatusCode, body
	}
	code, body := get(url.Values{"q": {"which star is the sun"}, "k": {"1"}})
	var results []index.SearchResult
	if err := json.Unmarshal(body["results"], &results); err != nil {
		t.Fatal(err)
	}
	if code != 200 || len(results) != 1 || results[0].Key != "sun" || results[0].Version != 1 || results[0].Text == "" ||
		results[0].ChunkID != contract.ChunkID("sun", 1, 0).String() {
		t.Fatalf("search: %d %+v", code, results)
	}
	for _, bad := range []url.Values{{}, {"q": {"x"}, "k": {"0"}}, {"q": {"x"}, "k": {"1001"}}, {"q": {"x"}, "k": {"many"}}} {
		if code, body := get(bad); code != 400 || body["error"] == nil {
			t.Fatalf("search %v: %d %s", bad, code, body["error"])
		}
	}
}
