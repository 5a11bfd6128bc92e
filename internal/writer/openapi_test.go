package writer_test

import (
	"bufio"
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"go/ast"
	"go/parser"
	"go/token"
	"io"
	"net/http"
	"net/http/httptest"
	"os"
	"path/filepath"
	"slices"
	"sort"
	"strconv"
	"strings"
	"testing"

	"github.com/jackc/pgx/v5/pgconn"

	"github.com/converge-sync/converge/api"
	"github.com/converge-sync/converge/internal/auth"
	"github.com/converge-sync/converge/internal/auth/authtest"
	"github.com/converge-sync/converge/internal/docstore"
	"github.com/converge-sync/converge/internal/writer"
	"github.com/converge-sync/converge/pkg/contract"
)

// The spec, api/openapi.json, and the handlers must agree: on the routes,
// and on every status and error code of each route. The codes of a batch's
// result lines count as codes of its 200.

// answer is one (route, status, code) of the API: code "" for a success.
type answer struct {
	route  string // "METHOD /path" with {key} for a wildcard
	status int
	code   string
}

func (a answer) String() string { return fmt.Sprintf("%s -> %d %s", a.route, a.status, a.code) }

type openAPI struct {
	doc map[string]any
}

func loadOpenAPI(t *testing.T) openAPI {
	t.Helper()
	var doc map[string]any
	if err := json.Unmarshal(api.OpenAPI, &doc); err != nil {
		t.Fatalf("api/openapi.json is not JSON: %v", err)
	}
	if doc["openapi"] != "3.1.0" {
		t.Fatalf("api/openapi.json is OpenAPI %v, want 3.1.0", doc["openapi"])
	}
	return openAPI{doc: doc}
}

// resolve follows a local $ref.
func (o openAPI) resolve(t *testing.T, v any) map[string]any {
	t.Helper()
	m, _ := v.(map[string]any)
	for m != nil {
		ref, ok := m["$ref"].(string)
		if !ok {
			return m
		}
		var cur any = o.doc
		for _, part := range strings.Split(strings.TrimPrefix(ref, "#/"), "/") {
			cur = cur.(map[string]any)[part]
		}
		if cur == nil {
			t.Fatalf("api/openapi.json: $ref %s leads nowhere", ref)
		}
		m = cur.(map[string]any)
	}
	return m
}

// errorCodes are the enum of the code of an error body schema, nil when the
// schema is not one.
func (o openAPI) errorCodes(t *testing.T, schema any) []string {
	s := o.resolve(t, schema)
	props, _ := s["properties"].(map[string]any)
	e := o.resolve(t, props["error"])
	if e == nil {
		return nil
	}
	eprops, _ := e["properties"].(map[string]any)
	code := o.resolve(t, eprops["code"])
	var out []string
	for _, c := range code["enum"].([]any) {
		out = append(out, c.(string))
	}
	if len(out) == 0 {
		t.Fatalf("api/openapi.json: an error schema without codes")
	}
	return out
}

var methods = []string{"get", "put", "post", "delete", "patch", "head", "options"}

// routes are the spec's operations, "METHOD /path".
func (o openAPI) routes(t *testing.T) []string {
	var out []string
	for path, item := range o.doc["paths"].(map[string]any) {
		for _, m := range methods {
			if _, ok := item.(map[string]any)[m]; ok {
				out = append(out, strings.ToUpper(m)+" "+path)
			}
		}
	}
	sort.Strings(out)
	return out
}

// answers are the spec's (route, status, code): each status of each
// operation, with each code its error body lists; a 200 with "" and, for
// the batch, each code its result lines list.
func (o openAPI) answers(t *testing.T) map[answer]bool {
	out := map[answer]bool{}
	for path, item := range o.doc["paths"].(map[string]any) {
		for _, m := range methods {
			op, ok := item.(map[string]any)[m].(map[string]any)
			if !ok {
				continue
			}
			route := strings.ToUpper(m) + " " + path
			for status, resp := range op["responses"].(map[string]any) {
				code, err := strconv.Atoi(status)
				if err != nil {
					t.Fatalf("api/openapi.json: %s has response %q, not a status", route, status)
				}
				r := o.resolve(t, resp)
				content, _ := r["content"].(map[string]any)
				if code == http.StatusOK {
					out[answer{route, code, ""}] = true
					for _, media := range content {
						schema := o.resolve(t, media.(map[string]any)["schema"])
						if schema["type"] != "array" {
							continue
						}
						line := o.resolve(t, schema["items"])
						for _, alt := range line["oneOf"].([]any) {
							if codes := o.errorCodes(t, alt); codes != nil {
								for _, c := range codes {
									out[answer{route, code, c}] = true
								}
							}
						}
					}
					continue
				}
				media, ok := content["application/json"].(map[string]any)
				if !ok {
					t.Fatalf("api/openapi.json: %s %d has no application/json error body", route, code)
				}
				codes := o.errorCodes(t, media["schema"])
				if codes == nil {
					t.Fatalf("api/openapi.json: %s %d is not the error shape", route, code)
				}
				for _, c := range codes {
					out[answer{route, code, c}] = true
				}
			}
		}
	}
	return out
}

// specRoute is a ServeMux pattern as the spec writes its path.
func specRoute(pattern string) string { return strings.ReplaceAll(pattern, "...}", "}") }

func TestOpenAPIRoutesAreTheHandlers(t *testing.T) {
	spec := loadOpenAPI(t)
	var served []string
	for _, p := range writer.NewAPI(nil, writer.APIConfig{}, nil, nil).Routes() {
		served = append(served, specRoute(p))
	}
	sort.Strings(served)
	if got := spec.routes(t); !slices.Equal(got, served) {
		t.Fatalf("api/openapi.json describes\n  %s\nthe writer serves\n  %s", strings.Join(got, "\n  "), strings.Join(served, "\n  "))
	}
}

func TestOpenAPIIsServed(t *testing.T) {
	srv := httptest.NewServer(writer.NewAPI(nil, writer.APIConfig{Guard: auth.NewGuard(authtest.Tokens(t, contractTokens), nil, nil)}, nil, nil))
	defer srv.Close()
	resp, err := http.Get(srv.URL + "/openapi.json") // no token: the description is public
	if err != nil {
		t.Fatal(err)
	}
	body, _ := io.ReadAll(resp.Body)
	resp.Body.Close()
	if resp.StatusCode != 200 || resp.Header.Get("Content-Type") != "application/json" || !bytes.Equal(body, api.OpenAPI) {
		t.Fatalf("GET /openapi.json: %d %q, %d bytes, want the %d of api/openapi.json", resp.StatusCode, resp.Header.Get("Content-Type"), len(body), len(api.OpenAPI))
	}
}

const (
	tokenAll   = "sk_contract_all_0123456789"
	tokenRead  = "sk_contract_read_012345678"
	tokenAdmin = "sk_contract_admin_01234567"
)

const contractTokens = "client write,admin,read " + tokenAll + "\n" +
	"reader read " + tokenRead + "\n" +
	"ops admin " + tokenAdmin + "\n"

// failingStore fails every call with err, or, for Apply with a permanent
// error, answers each write with it as Postgres would.
type failingStore struct{ err error }

func (f failingStore) Apply(_ context.Context, writes []docstore.Write) ([]docstore.Outcome, error) {
	return nil, f.err
}
func (f failingStore) Get(context.Context, string) (docstore.Record, error) {
	return docstore.Record{}, f.err
}
func (f failingStore) Reemit(context.Context, []string) (docstore.Reemitted, error) {
	return docstore.Reemitted{}, f.err
}
func (f failingStore) ReemitAll(context.Context, string, int) (docstore.Reemitted, string, error) {
	return docstore.Reemitted{}, "", f.err
}

// probe is one request and the answers it must get: one, or for a batch
// the 200 and each line's code.
type probe struct {
	name         string
	server       string // "pg" (the real store), or a failing store's name
	method, path string
	ctype, token string
	body         string
	want         []answer
}

// TestOpenAPIAnswersAreTheHandlers sends requests that provoke every
// answer of every route, against the writer over Postgres and, for the
// answers of a failing store, over one that fails. Each must get the
// answer it expects, and the answers seen must be exactly the spec's.
func TestOpenAPIAnswersAreTheHandlers(t *testing.T) {
	spec := loadOpenAPI(t)
	guard := auth.NewGuard(authtest.Tokens(t, contractTokens), nil, nil)
	e := newEnv(t)
	servers := map[string]string{}
	real := httptest.NewServer(writer.NewAPI(e.store, writer.APIConfig{BatchSize: 100, Guard: guard}, nil, nil))
	t.Cleanup(real.Close)
	servers["pg"] = real.URL
	for name, err := range map[string]error{
		"down":           errors.New("dial tcp 127.0.0.1:5432: connection refused"),
		"cancelled":      context.Canceled,
		"refusing":       &pgconn.PgError{Code: "22P05", Message: "unsupported Unicode escape sequence"},
		"irreproducible": &docstore.NotReproducibleError{Key: "k", Version: 1},
	} {
		srv := httptest.NewServer(writer.NewAPI(failingStore{err}, writer.APIConfig{Guard: guard}, nil, nil))
		t.Cleanup(srv.Close)
		servers[name] = srv.URL
	}

	const (
		put    = "PUT /v1/documents/{key}"
		del    = "DELETE /v1/documents/{key}"
		get    = "GET /v1/documents/{key}"
		batch  = "POST /v1/documents:batch"
		reemit = "POST /v1/admin/reemit"
		spec_  = "GET /openapi.json"
		js     = "application/json"
		nd     = "application/x-ndjson"
	)
	one := func(route string, status int, code string) []answer { return []answer{{route, status, code}} }
	lines := func(codes ...string) []answer {
		out := []answer{{batch, 200, ""}}
		for _, c := range codes {
			out = append(out, answer{batch, 200, c})
		}
		return out
	}
	longKey := strings.Repeat("k", contract.MaxKeyBytes+1)
	bigBody := strings.Repeat("x", contract.MaxBodyBytes+1)
	// 4 MiB of quotes: within the body's limit, twice that once escaped in
	// the event.
	escaping := strings.Repeat(`\"`, contract.MaxBodyBytes)
	manyLinks := `["` + strings.Repeat(`l","`, contract.MaxLinks) + `l"]`
	manyTags := `["` + strings.Repeat(`t","`, contract.MaxTags) + `t"]`
	bigMeta := `{"m":"` + strings.Repeat("m", contract.MaxMetaBytes) + `"}`
	longTitle := strings.Repeat("t", contract.MaxTitleBytes+1)
	hugeLine := `{"key":"h","version":1,"body":"` + strings.Repeat("x", writer.MaxRequestBytes) + `"}`
	manyKeys := `{"keys":["` + strings.Repeat(`k","`, writer.MaxReemitKeys) + `k"]}`
	hugeReemit := `{"keys":["` + strings.Repeat(`k`, 60<<20) + `"]}`

	probes := []probe{
		{name: "put", method: "PUT", path: "/v1/documents/k", ctype: js, body: `{"version":1,"title":"T","body":"kept"}`, want: one(put, 200, "")},
		{name: "put bad json", method: "PUT", path: "/v1/documents/k", ctype: js, body: `{"version":2,`, want: one(put, 400, "invalid_json")},
		{name: "put bad utf8", method: "PUT", path: "/v1/documents/k", ctype: js, body: "{\"version\":2,\"title\":\"\xff\"}", want: one(put, 400, "invalid_utf8")},
		{name: "put no token", method: "PUT", path: "/v1/documents/k", ctype: js, token: "-", body: `{"version":2}`, want: one(put, 401, "unauthorized")},
		{name: "put read token", method: "PUT", path: "/v1/documents/k", ctype: js, token: tokenRead, body: `{"version":2}`, want: one(put, 403, "forbidden")},
		{name: "put conflict", method: "PUT", path: "/v1/documents/k", ctype: js, body: `{"version":1,"title":"other"}`, want: one(put, 409, "version_conflict")},
		{name: "put request too large", method: "PUT", path: "/v1/documents/k", ctype: js, body: `{"version":2,"body":"` + strings.Repeat("x", writer.MaxRequestBytes) + `"}`, want: one(put, 413, "request_too_large")},
		{name: "put body too large", method: "PUT", path: "/v1/documents/k", ctype: js, body: `{"version":2,"body":"` + bigBody + `"}`, want: one(put, 413, "body_too_large")},
		{name: "put meta too large", method: "PUT", path: "/v1/documents/k", ctype: js, body: `{"version":2,"meta":` + bigMeta + `}`, want: one(put, 413, "meta_too_large")},
		{name: "put too many links", method: "PUT", path: "/v1/documents/k", ctype: js, body: `{"version":2,"links":` + manyLinks + `}`, want: one(put, 413, "too_many_links")},
		{name: "put too many tags", method: "PUT", path: "/v1/documents/k", ctype: js, body: `{"version":2,"tags":` + manyTags + `}`, want: one(put, 413, "too_many_tags")},
		{name: "put title too long", method: "PUT", path: "/v1/documents/k", ctype: js, body: `{"version":2,"title":"` + longTitle + `"}`, want: one(put, 413, "title_too_long")},
		{name: "put event too large", method: "PUT", path: "/v1/documents/k", ctype: js, body: `{"version":2,"body":"` + escaping + `"}`, want: one(put, 413, "event_too_large")},
		{name: "put wrong media type", method: "PUT", path: "/v1/documents/k", ctype: "text/plain", body: `{"version":2}`, want: one(put, 415, "unsupported_media_type")},
		{name: "put empty key", method: "PUT", path: "/v1/documents/", ctype: js, body: `{"version":2}`, want: one(put, 422, "missing_key")},
		{name: "put key too long", method: "PUT", path: "/v1/documents/" + longKey, ctype: js, body: `{"version":2}`, want: one(put, 422, "key_too_long")},
		{name: "put control char", method: "PUT", path: "/v1/documents/a%09b", ctype: js, body: `{"version":2}`, want: one(put, 422, "key_control_character")},
		{name: "put key mismatch", method: "PUT", path: "/v1/documents/k", ctype: js, body: `{"key":"j","version":2}`, want: one(put, 422, "key_mismatch")},
		{name: "put no version", method: "PUT", path: "/v1/documents/k", ctype: js, body: `{"title":"x"}`, want: one(put, 422, "missing_version")},
		{name: "put bad version", method: "PUT", path: "/v1/documents/k", ctype: js, body: `{"version":0}`, want: one(put, 422, "invalid_version")},
		{name: "put bad meta", method: "PUT", path: "/v1/documents/k", ctype: js, body: `{"version":2,"meta":[1]}`, want: one(put, 422, "invalid_meta")},
		{name: "put bad link", method: "PUT", path: "/v1/documents/k", ctype: js, body: `{"version":2,"links":[""]}`, want: one(put, 422, "invalid_link")},
		{name: "put bad tag", method: "PUT", path: "/v1/documents/k", ctype: js, body: `{"version":2,"tags":[""]}`, want: one(put, 422, "invalid_tag")},
		{name: "put NUL", method: "PUT", path: "/v1/documents/k", ctype: js, body: `{"version":2,"body":"a\u0000b"}`, want: one(put, 422, "nul_character")},
		{name: "put refused by postgres", server: "refusing", method: "PUT", path: "/v1/documents/k", ctype: js, body: `{"version":2}`, want: one(put, 422, "rejected_value")},
		{name: "put store down", server: "down", method: "PUT", path: "/v1/documents/k", ctype: js, body: `{"version":2}`, want: one(put, 503, "store_unavailable")},
		{name: "put cancelled", server: "cancelled", method: "PUT", path: "/v1/documents/k", ctype: js, body: `{"version":2}`, want: one(put, 503, "unavailable")},

		{name: "delete", method: "DELETE", path: "/v1/documents/gone?version=1", want: one(del, 200, "")},
		{name: "delete bad utf8", method: "DELETE", path: "/v1/documents/%FF?version=1", want: one(del, 400, "invalid_utf8")},
		{name: "delete no token", method: "DELETE", path: "/v1/documents/k?version=1", token: "-", want: one(del, 401, "unauthorized")},
		{name: "delete read token", method: "DELETE", path: "/v1/documents/k?version=1", token: tokenRead, want: one(del, 403, "forbidden")},
		{name: "delete conflict", method: "DELETE", path: "/v1/documents/k?version=1", want: one(del, 409, "version_conflict")},
		{name: "delete empty key", method: "DELETE", path: "/v1/documents/?version=1", want: one(del, 422, "missing_key")},
		{name: "delete key too long", method: "DELETE", path: "/v1/documents/" + longKey + "?version=1", want: one(del, 422, "key_too_long")},
		{name: "delete control char", method: "DELETE", path: "/v1/documents/a%01?version=1", want: one(del, 422, "key_control_character")},
		{name: "delete no version", method: "DELETE", path: "/v1/documents/k", want: one(del, 422, "missing_version")},
		{name: "delete bad version", method: "DELETE", path: "/v1/documents/k?version=x", want: one(del, 422, "invalid_version")},
		{name: "delete store down", server: "down", method: "DELETE", path: "/v1/documents/k?version=1", want: one(del, 503, "store_unavailable")},
		{name: "delete cancelled", server: "cancelled", method: "DELETE", path: "/v1/documents/k?version=1", want: one(del, 503, "unavailable")},

		{name: "get", method: "GET", path: "/v1/documents/k", want: one(get, 200, "")},
		{name: "get read token", method: "GET", path: "/v1/documents/k", token: tokenRead, want: one(get, 200, "")},
		{name: "get bad utf8", method: "GET", path: "/v1/documents/%FF", want: one(get, 400, "invalid_utf8")},
		{name: "get no token", method: "GET", path: "/v1/documents/k", token: "-", want: one(get, 401, "unauthorized")},
		{name: "get admin token", method: "GET", path: "/v1/documents/k", token: tokenAdmin, want: one(get, 403, "forbidden")},
		{name: "get missing", method: "GET", path: "/v1/documents/never", want: one(get, 404, "not_found")},
		{name: "get empty key", method: "GET", path: "/v1/documents/", want: one(get, 422, "missing_key")},
		{name: "get key too long", method: "GET", path: "/v1/documents/" + longKey, want: one(get, 422, "key_too_long")},
		{name: "get control char", method: "GET", path: "/v1/documents/%7F", want: one(get, 422, "key_control_character")},
		{name: "get store down", server: "down", method: "GET", path: "/v1/documents/k", want: one(get, 503, "store_unavailable")},
		{name: "get cancelled", server: "cancelled", method: "GET", path: "/v1/documents/k", want: one(get, 503, "unavailable")},

		{name: "batch", method: "POST", path: "/v1/documents:batch", ctype: nd, body: strings.Join([]string{
			`{"key":"b1","version":1,"body":"x"}`,
			`{"key":"b2","version":1,"withdrawn":true}`,
			`not json`,
			"{\"key\":\"b3\",\"version\":1,\"title\":\"\xff\"}",
			`{"key":"k","version":1,"title":"other"}`,
			hugeLine,
			`{"key":"b4","version":1,"body":"` + bigBody + `"}`,
			`{"key":"b5","version":1,"meta":` + bigMeta + `}`,
			`{"key":"b6","version":1,"links":` + manyLinks + `}`,
			`{"key":"b7","version":1,"tags":` + manyTags + `}`,
			`{"key":"b8","version":1,"title":"` + longTitle + `"}`,
			`{"key":"b9","version":1,"body":"` + escaping + `"}`,
			`{"version":1}`,
			`{"key":"` + longKey + `","version":1}`,
			`{"key":"a\u0001","version":1}`,
			`{"key":"b10"}`,
			`{"key":"b11","version":-1}`,
			`{"key":"b12","version":1,"meta":"m"}`,
			`{"key":"b13","version":1,"links":[""]}`,
			`{"key":"b14","version":1,"tags":[""]}`,
			`{"key":"b15","version":1,"title":"\u0000"}`,
		}, "\n"), want: lines("invalid_json", "invalid_utf8", "version_conflict", "request_too_large", "body_too_large",
			"meta_too_large", "too_many_links", "too_many_tags", "title_too_long", "event_too_large", "missing_key",
			"key_too_long", "key_control_character", "missing_version", "invalid_version", "invalid_meta",
			"invalid_link", "invalid_tag", "nul_character")},
		{name: "batch refused by postgres", server: "refusing", method: "POST", path: "/v1/documents:batch", ctype: nd, body: `{"key":"r","version":1}`, want: lines("rejected_value")},
		{name: "batch store down", server: "down", method: "POST", path: "/v1/documents:batch", ctype: nd, body: `{"key":"r","version":1}`, want: lines("store_unavailable")},
		{name: "batch cancelled", server: "cancelled", method: "POST", path: "/v1/documents:batch", ctype: nd, body: `{"key":"r","version":1}`, want: lines("unavailable")},
		{name: "batch no token", method: "POST", path: "/v1/documents:batch", ctype: nd, token: "-", body: `{"key":"r","version":1}`, want: one(batch, 401, "unauthorized")},
		{name: "batch read token", method: "POST", path: "/v1/documents:batch", ctype: nd, token: tokenRead, body: `{"key":"r","version":1}`, want: one(batch, 403, "forbidden")},
		{name: "batch wrong media type", method: "POST", path: "/v1/documents:batch", ctype: js, body: `{"key":"r","version":1}`, want: one(batch, 415, "unsupported_media_type")},

		{name: "reemit", method: "POST", path: "/v1/admin/reemit", ctype: js, token: tokenAdmin, body: `{"keys":["k","never"]}`, want: one(reemit, 200, "")},
		{name: "reemit all", method: "POST", path: "/v1/admin/reemit", ctype: js, body: `{"all":true,"limit":1}`, want: one(reemit, 200, "")},
		{name: "reemit bad json", method: "POST", path: "/v1/admin/reemit", ctype: js, body: `{"keys":`, want: one(reemit, 400, "invalid_json")},
		{name: "reemit bad utf8", method: "POST", path: "/v1/admin/reemit", ctype: js, body: "{\"keys\":[\"\xff\"]}", want: one(reemit, 400, "invalid_utf8")},
		{name: "reemit no token", method: "POST", path: "/v1/admin/reemit", ctype: js, token: "-", body: `{"all":true}`, want: one(reemit, 401, "unauthorized")},
		{name: "reemit read token", method: "POST", path: "/v1/admin/reemit", ctype: js, token: tokenRead, body: `{"all":true}`, want: one(reemit, 403, "forbidden")},
		{name: "reemit too large", method: "POST", path: "/v1/admin/reemit", ctype: js, body: hugeReemit, want: one(reemit, 413, "request_too_large")},
		{name: "reemit wrong media type", method: "POST", path: "/v1/admin/reemit", ctype: "text/plain", body: `{"all":true}`, want: one(reemit, 415, "unsupported_media_type")},
		{name: "reemit neither", method: "POST", path: "/v1/admin/reemit", ctype: js, body: `{}`, want: one(reemit, 422, "invalid_request")},
		{name: "reemit too many keys", method: "POST", path: "/v1/admin/reemit", ctype: js, body: manyKeys, want: one(reemit, 422, "too_many_keys")},
		{name: "reemit bad limit", method: "POST", path: "/v1/admin/reemit", ctype: js, body: `{"all":true,"limit":5001}`, want: one(reemit, 422, "invalid_limit")},
		{name: "reemit empty key", method: "POST", path: "/v1/admin/reemit", ctype: js, body: `{"keys":[""]}`, want: one(reemit, 422, "missing_key")},
		{name: "reemit key too long", method: "POST", path: "/v1/admin/reemit", ctype: js, body: `{"keys":["` + longKey + `"]}`, want: one(reemit, 422, "key_too_long")},
		{name: "reemit control char", method: "POST", path: "/v1/admin/reemit", ctype: js, body: `{"keys":["\u001b"]}`, want: one(reemit, 422, "key_control_character")},
		{name: "reemit irreproducible", server: "irreproducible", method: "POST", path: "/v1/admin/reemit", ctype: js, body: `{"keys":["k"]}`, want: one(reemit, 500, "not_reproducible")},
		{name: "reemit store down", server: "down", method: "POST", path: "/v1/admin/reemit", ctype: js, body: `{"keys":["k"]}`, want: one(reemit, 503, "store_unavailable")},
		{name: "reemit cancelled", server: "cancelled", method: "POST", path: "/v1/admin/reemit", ctype: js, body: `{"all":true}`, want: one(reemit, 503, "unavailable")},

		{name: "openapi", method: "GET", path: "/openapi.json", token: "-", want: one(spec_, 200, "")},
	}

	seen := map[answer]bool{}
	for _, p := range probes {
		server := p.server
		if server == "" {
			server = "pg"
		}
		got := send(t, servers[server], p)
		for _, a := range got {
			seen[a] = true
		}
		if !sameAnswers(got, p.want) {
			t.Errorf("%s: answered %v, want %v", p.name, got, p.want)
		}
	}
	documented := spec.answers(t)
	for a := range seen {
		if !documented[a] {
			t.Errorf("the writer answers %v, which api/openapi.json does not list", a)
		}
	}
	for a := range documented {
		if !seen[a] {
			t.Errorf("api/openapi.json lists %v, which no request got from the writer", a)
		}
	}
}

// send makes p's request and returns its answers: for a 200 of the batch,
// the 200 and the code of each line that failed.
func send(t *testing.T, base string, p probe) []answer {
	t.Helper()
	req, err := http.NewRequest(p.method, base+p.path, strings.NewReader(p.body))
	if err != nil {
		t.Fatal(err)
	}
	if p.ctype != "" {
		req.Header.Set("Content-Type", p.ctype)
	}
	switch p.token {
	case "":
		auth.SetBearer(req.Header, tokenAll)
	case "-":
	default:
		auth.SetBearer(req.Header, p.token)
	}
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatalf("%s: %v", p.name, err)
	}
	defer resp.Body.Close()
	route := routeOf(p)
	out := []answer{{route, resp.StatusCode, ""}}
	type errBody struct {
		Error *writer.ErrorBody `json:"error"`
	}
	if resp.StatusCode != 200 {
		var b errBody
		if err := json.NewDecoder(resp.Body).Decode(&b); err != nil || b.Error == nil || b.Error.Message == "" {
			t.Fatalf("%s: %d without the error shape (%v)", p.name, resp.StatusCode, err)
		}
		out[0].code = b.Error.Code
		if resp.StatusCode == 401 && resp.Header.Get("WWW-Authenticate") == "" {
			t.Errorf("%s: 401 without WWW-Authenticate", p.name)
		}
		return out
	}
	if route != "POST /v1/documents:batch" {
		_, _ = io.Copy(io.Discard, resp.Body)
		return out
	}
	sc := bufio.NewScanner(resp.Body)
	sc.Buffer(nil, 1<<20)
	for sc.Scan() {
		var b errBody
		if err := json.Unmarshal(sc.Bytes(), &b); err != nil {
			t.Fatalf("%s: a result line is not JSON: %v", p.name, err)
		}
		if b.Error != nil {
			out = append(out, answer{route, 200, b.Error.Code})
		}
	}
	if err := sc.Err(); err != nil {
		t.Fatalf("%s: reading the results: %v", p.name, err)
	}
	return out
}

func routeOf(p probe) string {
	path, _, _ := strings.Cut(p.path, "?")
	if strings.HasPrefix(path, "/v1/documents/") {
		path = "/v1/documents/{key}"
	}
	return p.method + " " + path
}

func sameAnswers(a, b []answer) bool {
	key := func(x []answer) []string {
		var s []string
		for _, v := range x {
			s = append(s, v.String())
		}
		sort.Strings(s)
		return slices.Compact(s)
	}
	return slices.Equal(key(a), key(b))
}

// TestOpenAPIListsEveryCodeInTheSource reads the error codes the writer's
// code can give (the contract's codes, and each code written out in the
// writer, the document store and the guard) and finds each in the spec,
// so that a new code cannot reach a client undocumented even before a
// request of the test above provokes it.
func TestOpenAPIListsEveryCodeInTheSource(t *testing.T) {
	spec := loadOpenAPI(t)
	documented := map[string]bool{}
	for a := range spec.answers(t) {
		documented[a.code] = true
	}
	// Codes of events and the queue path, never of an HTTP answer.
	notHTTP := map[string]string{
		contract.CodeInvalidEvent:     "an event's, in the projectors",
		contract.CodeUnknownSchema:    "an event's, in the projectors",
		contract.CodeIdentityMismatch: "an event's, in the projectors",
		"subject_mismatch":            "the queue path's: a document on another document's ingest subject",
		writer.CodeUnknownSource:      "a mapped table's changed row's, kept in converge_inbox",
		writer.CodeDuplicateKey:       "a mapped table's changed row's, kept in converge_inbox",
		writer.CodeRowTwice:           "a mapped table's changed row's, kept in converge_inbox",
		writer.CodeRowUnreadable:      "a mapped table's changed row's, kept in converge_inbox",
	}
	found := map[string]string{}
	for _, dir := range []string{"../../pkg/contract", ".", "../docstore", "../auth", "../httpjson"} {
		for code, where := range codesIn(t, dir) {
			found[code] = where
		}
	}
	if len(found) < 30 {
		t.Fatalf("found only %d codes in the source: the scan is broken", len(found))
	}
	for code, where := range found {
		if _, ok := notHTTP[code]; ok {
			continue
		}
		if !documented[code] {
			t.Errorf("code %q (%s) is not in api/openapi.json", code, where)
		}
	}
	for code, why := range notHTTP {
		if _, ok := found[code]; !ok {
			t.Errorf("code %q (%s) is no longer in the source: drop it from this test", code, why)
		}
	}
}

// codesIn returns the error codes written out in the non-test Go files of
// dir: the values of Code* constants and of Code fields, and the string
// given as the code to invalid, writeError and httpjson.Error.
func codesIn(t *testing.T, dir string) map[string]string {
	t.Helper()
	files, err := filepath.Glob(filepath.Join(dir, "*.go"))
	if err != nil {
		t.Fatal(err)
	}
	out := map[string]string{}
	fset := token.NewFileSet()
	for _, name := range files {
		if strings.HasSuffix(name, "_test.go") {
			continue
		}
		src, err := os.ReadFile(name)
		if err != nil {
			t.Fatal(err)
		}
		f, err := parser.ParseFile(fset, name, src, 0)
		if err != nil {
			t.Fatal(err)
		}
		lit := func(e ast.Expr) {
			if bl, ok := e.(*ast.BasicLit); ok && bl.Kind == token.STRING {
				if s, err := strconv.Unquote(bl.Value); err == nil {
					out[s] = fset.Position(bl.Pos()).String()
				}
			}
		}
		ast.Inspect(f, func(n ast.Node) bool {
			switch n := n.(type) {
			case *ast.ValueSpec:
				for i, id := range n.Names {
					if strings.HasPrefix(id.Name, "Code") && i < len(n.Values) {
						lit(n.Values[i])
					}
				}
			case *ast.KeyValueExpr:
				if id, ok := n.Key.(*ast.Ident); ok && id.Name == "Code" {
					lit(n.Value)
				}
			case *ast.CallExpr:
				var fn string
				switch f := n.Fun.(type) {
				case *ast.Ident:
					fn = f.Name
				case *ast.SelectorExpr:
					fn = f.Sel.Name
				}
				switch {
				case fn == "invalid" && len(n.Args) > 0:
					lit(n.Args[0])
				case (fn == "writeError" || fn == "Error") && len(n.Args) > 2:
					lit(n.Args[2])
				}
			case *ast.ReturnStmt:
				// errorStatus returns (status, code) pairs.
				if len(n.Results) == 2 {
					lit(n.Results[1])
				}
			}
			return true
		})
	}
	return out
}
