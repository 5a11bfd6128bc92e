//go:build linux

package e2e_test

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"net/url"
	"slices"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/google/uuid"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/converge-sync/converge/internal/index"
	"github.com/converge-sync/converge/internal/index/qdrant"
	"github.com/converge-sync/converge/internal/rebuild"
	"github.com/converge-sync/converge/internal/testenv"
)

// qdrantREST is Qdrant's HTTP API, with the key it is given: the tests'
// way to the points past the adapter, which speaks gRPC.
type qdrantREST struct {
	url string // http://host:port
	key string // sent as the api-key header when set
}

// call sends body (nil: none) as JSON and decodes the response's result
// into out (nil: ignored), numbers as json.Number.
func (r qdrantREST) call(ctx context.Context, method, path string, body, out any) error {
	var in io.Reader
	if body != nil {
		b, err := json.Marshal(body)
		if err != nil {
			return err
		}
		in = bytes.NewReader(b)
	}
	req, err := http.NewRequestWithContext(ctx, method, r.url+path, in)
	if err != nil {
		return err
	}
	req.Header.Set("Content-Type", "application/json")
	if r.key != "" {
		req.Header.Set("api-key", r.key)
	}
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		return err
	}
	defer resp.Body.Close()
	b, err := io.ReadAll(resp.Body)
	if err != nil {
		return err
	}
	if resp.StatusCode != http.StatusOK {
		return fmt.Errorf("qdrant %s %s: %s: %s", method, path, resp.Status, b)
	}
	if out == nil {
		return nil
	}
	var env struct {
		Result json.RawMessage `json:"result"`
	}
	if err := json.Unmarshal(b, &env); err != nil {
		return fmt.Errorf("qdrant %s %s: %w", method, path, err)
	}
	dec := json.NewDecoder(bytes.NewReader(env.Result))
	dec.UseNumber()
	return dec.Decode(out)
}

// restPoint is a point as the HTTP API returns it, without its vector.
type restPoint struct {
	ID      string         `json:"id"`
	Payload map[string]any `json:"payload"`
}

// scroll calls fn for every point of collection (or alias) that filter
// (nil: every point) selects.
func (r qdrantREST) scroll(ctx context.Context, collection string, filter any, fn func(restPoint) error) error {
	var offset any
	for {
		req := map[string]any{"limit": 256, "with_payload": true, "with_vector": false}
		if filter != nil {
			req["filter"] = filter
		}
		if offset != nil {
			req["offset"] = offset
		}
		var page struct {
			Points []restPoint `json:"points"`
			Next   any         `json:"next_page_offset"`
		}
		if err := r.call(ctx, http.MethodPost, "/collections/"+url.PathEscape(collection)+"/points/scroll", req, &page); err != nil {
			return err
		}
		for _, p := range page.Points {
			if err := fn(p); err != nil {
				return err
			}
		}
		if page.Next == nil {
			return nil
		}
		offset = page.Next
	}
}

// chunkOf reads a chunk point's payload as the adapter writes it
// (internal/index/qdrant/payload.go).
func chunkOf(p restPoint) (index.Point, error) {
	id, err := uuid.Parse(p.ID)
	if err != nil {
		return index.Point{}, fmt.Errorf("point id %q: %w", p.ID, err)
	}
	str := func(f string) string { s, _ := p.Payload[f].(string); return s }
	num := func(f string) (int64, error) {
		n, ok := p.Payload[f].(json.Number)
		if !ok {
			return 0, fmt.Errorf("point %s: %s is %T %v, not a number", p.ID, f, p.Payload[f], p.Payload[f])
		}
		return strconv.ParseInt(n.String(), 10, 64)
	}
	c := index.Point{ID: id, Key: str("key"), ContentHash: str("content_hash"), ChunkHash: str("chunk_hash"), Title: str("title"), Text: str("text")}
	if c.Version, err = num("version"); err != nil {
		return c, err
	}
	ordinal, err := num("ordinal")
	if err != nil {
		return c, err
	}
	c.Ordinal = int(ordinal)
	tags, _ := p.Payload["tags"].([]any)
	for _, tag := range tags {
		s, _ := tag.(string)
		c.Tags = append(c.Tags, s)
	}
	return c, nil
}

// points lists every point of collection (or alias): the chunks as the
// HTTP API reads them, the keys of the markers, and any other point but
// the one recording the embedder.
func (r qdrantREST) points(collection string) func(context.Context) (storedPoints, error) {
	return func(ctx context.Context) (storedPoints, error) {
		sp := storedPoints{markers: []string{}}
		embedders := 0
		err := r.scroll(ctx, collection, nil, func(p restPoint) error {
			switch kind, _ := p.Payload["type"].(string); kind {
			case "chunk":
				c, err := chunkOf(p)
				if err != nil {
					return err
				}
				sp.chunks = append(sp.chunks, c)
			case "marker":
				key, _ := p.Payload["key"].(string)
				sp.markers = append(sp.markers, key)
			case "embedder":
				if embedders++; embedders > 1 {
					sp.strays = append(sp.strays, fmt.Sprintf("a second embedder point %s", p.ID))
				}
			default:
				sp.strays = append(sp.strays, fmt.Sprintf("%s of type %q (payload %v)", p.ID, kind, p.Payload))
			}
			return nil
		})
		return sp, err
	}
}

// chunks are the chunk points of key in collection (or alias), by ordinal.
func (r qdrantREST) chunks(ctx context.Context, collection, key string) ([]index.Point, error) {
	filter := map[string]any{"must": []any{
		map[string]any{"key": "type", "match": map[string]any{"value": "chunk"}},
		map[string]any{"key": "key", "match": map[string]any{"value": key}},
	}}
	var out []index.Point
	err := r.scroll(ctx, collection, filter, func(p restPoint) error {
		c, err := chunkOf(p)
		out = append(out, c)
		return err
	})
	slices.SortFunc(out, func(a, b index.Point) int { return a.Ordinal - b.Ordinal })
	return out, err
}

// deletePoint deletes the point id from collection (or alias).
func (r qdrantREST) deletePoint(ctx context.Context, collection string, id uuid.UUID) error {
	return r.call(ctx, http.MethodPost, "/collections/"+url.PathEscape(collection)+"/points/delete?wait=true",
		map[string]any{"points": []string{id.String()}}, nil)
}

// setPayload sets fields of the point id's payload in collection (or
// alias), leaving its other fields as they are.
func (r qdrantREST) setPayload(ctx context.Context, collection string, id uuid.UUID, fields map[string]any) error {
	return r.call(ctx, http.MethodPost, "/collections/"+url.PathEscape(collection)+"/points/payload?wait=true",
		map[string]any{"payload": fields, "points": []string{id.String()}}, nil)
}

// collections lists the collections whose names start with prefix, sorted.
func (r qdrantREST) collections(ctx context.Context, prefix string) ([]string, error) {
	var res struct {
		Collections []struct {
			Name string `json:"name"`
		} `json:"collections"`
	}
	if err := r.call(ctx, http.MethodGet, "/collections", nil, &res); err != nil {
		return nil, err
	}
	var names []string
	for _, c := range res.Collections {
		if strings.HasPrefix(c.Name, prefix) {
			names = append(names, c.Name)
		}
	}
	slices.Sort(names)
	return names, nil
}

// aliasTarget is the collection alias names, "" when there is no such
// alias.
func (r qdrantREST) aliasTarget(ctx context.Context, alias string) (string, error) {
	var res struct {
		Aliases []struct {
			Alias      string `json:"alias_name"`
			Collection string `json:"collection_name"`
		} `json:"aliases"`
	}
	if err := r.call(ctx, http.MethodGet, "/aliases", nil, &res); err != nil {
		return "", err
	}
	for _, a := range res.Aliases {
		if a.Alias == alias {
			return a.Collection, nil
		}
	}
	return "", nil
}

// qdrantRebuilds is what rebuildQdrantIndex needs of a run of the
// binaries with the index on Qdrant.
type qdrantRebuilds struct {
	cli                       *cli
	env                       []string // the operator's
	q                         testenv.Qdrant
	proc                      *process // projector-index
	api, writeToken, operator string
	agrees                    func() bool // converge verify exits 0
}

// rebuildQdrantIndex runs `converge rebuild index` three times in a row on
// an index in Qdrant: a quiet one, one whose projector is SIGKILLed while
// it rebuilds (the restarted projector resumes it), and one while
// documents change. The first switches the alias from <collection>_1;
// after each the alias names the rebuilt collection, the previous one is
// gone, and converge verify agrees. It returns the commands, for the
// secrets check.
func rebuildQdrantIndex(t *testing.T, r qdrantRebuilds) []*backgroundRebuild {
	ctx := context.Background()
	rest := qdrantREST{url: r.q.HTTPURL, key: r.q.APIKey}
	prefix := r.q.Collection + "_"
	live := func() (target string, names []string) {
		t.Helper()
		target, err := rest.aliasTarget(ctx, r.q.Collection)
		if err != nil {
			t.Fatal(err)
		}
		if names, err = rest.collections(ctx, prefix); err != nil {
			t.Fatal(err)
		}
		return target, names
	}
	previous, names := live()
	if first := prefix + "1"; previous != first || !slices.Equal(names, []string{first}) {
		t.Fatalf("before the first rebuild the alias %s names %q and the collections are %v; want %s alone", r.q.Collection, previous, names, first)
	}
	var runs []*backgroundRebuild
	for i := 1; i <= 3; i++ {
		before := rebuildStatus(r.proc.addr, r.operator).ID
		run := startRebuild(t, r.cli, r.env, "index", r.proc.addr)
		runs = append(runs, run)
		var changed <-chan error
		switch i {
		case 2:
			testenv.Eventually(t, "the index rebuild to start", 30*time.Second, rebuildStarted(r.proc.addr, r.operator, before))
			t.Logf("index rebuild %d: projector-index SIGKILLed in phase %q", i, rebuildStatus(r.proc.addr, r.operator).Phase)
			r.proc.kill()
			r.proc.start()
			testenv.Eventually(t, "projector-index to be ready after the kill", 60*time.Second, r.proc.ready)
		case 3:
			changed = changeDocuments(r.api, r.writeToken, 3, 100, 150)
		}
		st, agreed := run.result(t, 120*time.Second)
		if changed != nil {
			if err := <-changed; err != nil {
				t.Fatal(err)
			}
		}
		if st.Phase != rebuild.PhaseDone || st.InPlace || st.Previous != previous || st.Target == previous || !strings.HasPrefix(st.Target, prefix) {
			t.Fatalf("index rebuild %d: %+v; want a blue/green one from %s into a fresh %s... collection\n%s", i, st, previous, prefix, run.out.String())
		}
		if !agreed && changed == nil {
			t.Fatalf("index rebuild %d: verify after it did not agree\n%s", i, run.out.String())
		}
		if target, names := live(); target != st.Target || !slices.Equal(names, []string{st.Target}) {
			t.Fatalf("after index rebuild %d the alias names %q and the collections are %v; want %s alone", i, target, names, st.Target)
		}
		testenv.Eventually(t, fmt.Sprintf("converge verify to exit 0 after index rebuild %d", i), 90*time.Second, r.agrees)
		t.Logf("index rebuild %d: %s -> %s, verify agrees", i, previous, st.Target)
		previous = st.Target
	}
	return runs
}

// damageQdrant damages the index in collection (or alias) behind its
// projector's back, through Qdrant's HTTP API: it deletes the first chunk
// point of deleted, and changes the payload of the last chunk point of
// changed (its text, and the chunk hash it declares); both documents have
// several chunks.
func damageQdrant(t *testing.T, rest qdrantREST, collection, deleted, changed string) {
	t.Helper()
	ctx := context.Background()
	for _, key := range []string{deleted, changed} {
		pts, err := rest.chunks(ctx, collection, key)
		if err != nil || len(pts) < 2 {
			t.Fatalf("the chunk points of %s: %d, %v; want several", key, len(pts), err)
		}
		if key == deleted {
			err = rest.deletePoint(ctx, collection, pts[0].ID)
		} else {
			err = rest.setPayload(ctx, collection, pts[len(pts)-1].ID, map[string]any{"text": "damaged", "chunk_hash": "damaged"})
		}
		if err != nil {
			t.Fatal(err)
		}
	}
	if pts, err := rest.chunks(ctx, collection, changed); err != nil || pts[len(pts)-1].Text != "damaged" {
		t.Fatalf("the damaged payload of %s reads back as %+v, %v", changed, pts, err)
	}
}

// qdrantEqualsPostgres checks that the index in q's collection (an alias)
// equals the Postgres database at dbURL point by point (diff), through the
// adapter and past it.
func qdrantEqualsPostgres(t *testing.T, q testenv.Qdrant, dbURL string) {
	t.Helper()
	ctx := context.Background()
	pool, err := pgxpool.New(ctx, dbURL)
	if err != nil {
		t.Fatal(err)
	}
	defer pool.Close()
	b, err := qdrant.New(ctx, qdrant.Config{Addr: q.URL, APIKey: q.APIKey, Collection: q.Collection})
	if err != nil {
		t.Fatal(err)
	}
	defer b.Close()
	d, err := diff(ctx, pool, b, qdrantREST{url: q.HTTPURL, key: q.APIKey}.points(q.Collection))
	if err != nil || d != "" {
		t.Fatalf("the index in Qdrant differs from Postgres: %s %v", d, err)
	}
}
