package testenv

import (
	"bytes"
	"context"
	"crypto/rand"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net/http"
	"net/url"
	"os"
	"os/exec"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"
)

// Qdrant is an instance of the project's test Qdrant server (Qdrant's own
// release binary, scripts/qdrant-server.sh) and a collection name for one
// test.
type Qdrant struct {
	URL         string // gRPC host:port on 127.0.0.1 (the form of qdrant.Config.Addr)
	HTTPURL     string // the REST API, http://127.0.0.1:PORT
	APIKey      string // "" on the open instance
	ReadOnlyKey string // "" on the open instance
	// Collection is a collection name for this test alone: "t_" and
	// lowercase letters and digits. When the test ends, every collection
	// whose name starts with it is deleted, and every alias so named or
	// pointing at one: a rebuild's generations Collection_1, _2, ... and
	// their alias Collection.
	Collection string
}

// Environment of a test run started by `scripts/qdrant-server.sh run` (as
// `make test` does): the open instance, and the keyed one with its keys.
const (
	EnvTestQdrantURL              = "CONVERGE_TEST_QDRANT_URL"
	EnvTestQdrantHTTPURL          = "CONVERGE_TEST_QDRANT_HTTP_URL"
	EnvTestQdrantKeyedURL         = "CONVERGE_TEST_QDRANT_KEYED_URL"
	EnvTestQdrantKeyedHTTPURL     = "CONVERGE_TEST_QDRANT_KEYED_HTTP_URL"
	EnvTestQdrantKeyedAPIKey      = "CONVERGE_TEST_QDRANT_KEYED_API_KEY"       //nolint:gosec // the name of a variable
	EnvTestQdrantKeyedReadOnlyKey = "CONVERGE_TEST_QDRANT_KEYED_READ_ONLY_KEY" //nolint:gosec // the name of a variable
)

const qdrantCleanupTimeout = time.Minute

// qdrantInstances are the instances of this test process's server, without
// a collection name, or why a test cannot have one.
type qdrantInstances struct {
	open, keyed     Qdrant
	noOpen, noKeyed error
}

var (
	qdrantOnce  sync.Once
	qdrantFound qdrantInstances
)

// LeaseQdrant returns the open instance (no API key) of the test Qdrant
// server, with a collection name for t alone; the collections and aliases
// of that name are deleted when t ends. Tests share the instance, each in
// collections of its own.
//
// The server is the one a `scripts/qdrant-server.sh run` around the test
// run started (CONVERGE_TEST_QDRANT_URL), or else one this process starts
// for itself with the same script, which stops when the process ends.
// Where neither can be had (no npm, and not root to install it), the test
// is skipped with the reason, loudly; with CI=true it fails instead, so
// that a CI run can never pass without Qdrant.
func LeaseQdrant(t testing.TB) Qdrant {
	t.Helper()
	return leaseQdrant(t, false)
}

// LeaseQdrantKeyed is LeaseQdrant on the keyed instance: it refuses a
// request without APIKey or ReadOnlyKey, and ReadOnlyKey allows reads
// only.
func LeaseQdrantKeyed(t testing.TB) Qdrant {
	t.Helper()
	return leaseQdrant(t, true)
}

func leaseQdrant(t testing.TB, keyed bool) Qdrant {
	t.Helper()
	qdrantOnce.Do(func() { qdrantFound = findQdrant() })
	q, missing := qdrantFound.open, qdrantFound.noOpen
	if keyed {
		q, missing = qdrantFound.keyed, qdrantFound.noKeyed
	}
	if missing != nil {
		noQdrant(t, missing)
	}
	q.Collection = "t_" + strings.ToLower(rand.Text()[:16])
	t.Cleanup(func() {
		if err := q.dropCollections(); err != nil {
			t.Errorf("testenv: deleting the collections %s* at %s: %v", q.Collection, q.HTTPURL, err)
		}
	})
	return q
}

// noQdrant ends t for want of a Qdrant server (why): a loud skip, or with
// CI=true a failure, so that a CI run can never pass without Qdrant.
func noQdrant(t testing.TB, why error) {
	t.Helper()
	if os.Getenv("CI") == "true" {
		t.Fatalf("testenv: no Qdrant server, and CI=true requires one: %v", why)
	}
	t.Skipf("testenv: SKIPPING, no Qdrant server: %v (make test starts one; scripts/qdrant-server.sh needs npm)", why)
}

// findQdrant reads the server of the test run from the environment, or
// starts one.
func findQdrant() qdrantInstances {
	if os.Getenv(EnvTestQdrantURL) == "" && os.Getenv(EnvTestQdrantKeyedURL) == "" {
		s, err := startOwnQdrant()
		if err != nil {
			return qdrantInstances{noOpen: err, noKeyed: err}
		}
		return s
	}
	s := qdrantInstances{
		open: Qdrant{URL: os.Getenv(EnvTestQdrantURL), HTTPURL: os.Getenv(EnvTestQdrantHTTPURL)},
		keyed: Qdrant{URL: os.Getenv(EnvTestQdrantKeyedURL), HTTPURL: os.Getenv(EnvTestQdrantKeyedHTTPURL),
			APIKey: os.Getenv(EnvTestQdrantKeyedAPIKey), ReadOnlyKey: os.Getenv(EnvTestQdrantKeyedReadOnlyKey)},
	}
	if s.open.URL == "" || s.open.HTTPURL == "" {
		s.noOpen = fmt.Errorf("the environment names no open instance: %s and %s are both needed", EnvTestQdrantURL, EnvTestQdrantHTTPURL)
	}
	if s.keyed.URL == "" || s.keyed.HTTPURL == "" || s.keyed.APIKey == "" || s.keyed.ReadOnlyKey == "" {
		s.noKeyed = fmt.Errorf("the environment names no keyed instance: %s, %s, %s and %s are all needed",
			EnvTestQdrantKeyedURL, EnvTestQdrantKeyedHTTPURL, EnvTestQdrantKeyedAPIKey, EnvTestQdrantKeyedReadOnlyKey)
	}
	return s
}

// startOwnQdrant starts the project's server for this process alone. It
// watches this process and stops (removing its folder) when it ends.
func startOwnQdrant() (qdrantInstances, error) {
	script, err := repoFile("scripts/qdrant-server.sh")
	if err != nil {
		return qdrantInstances{}, err
	}
	dir, err := os.MkdirTemp("", "converge-qdrant-")
	if err != nil {
		return qdrantInstances{}, err
	}
	cmd := exec.Command("bash", script, "start", dir)
	cmd.Env = append(os.Environ(), "QDRANT_PARENT_PID="+strconv.Itoa(os.Getpid()), "QDRANT_REMOVE_DIR=1")
	var stderr strings.Builder
	cmd.Stderr = &stderr
	out, err := cmd.Output()
	if err != nil {
		_ = os.RemoveAll(dir)
		return qdrantInstances{}, fmt.Errorf("%s start: %w: %s", script, err, strings.TrimSpace(lastLines(stderr.String(), 10)))
	}
	vars := scriptVars(out)
	s := qdrantInstances{
		open: Qdrant{URL: vars["CONVERGE_QDRANT_URL"], HTTPURL: vars["CONVERGE_QDRANT_HTTP_URL"]},
		keyed: Qdrant{URL: vars["CONVERGE_QDRANT_KEYED_URL"], HTTPURL: vars["CONVERGE_QDRANT_KEYED_HTTP_URL"],
			APIKey: vars["CONVERGE_QDRANT_API_KEY"], ReadOnlyKey: vars["CONVERGE_QDRANT_READ_ONLY_KEY"]},
	}
	if s.open.URL == "" || s.open.HTTPURL == "" || s.keyed.URL == "" || s.keyed.HTTPURL == "" || s.keyed.APIKey == "" {
		return qdrantInstances{}, fmt.Errorf("%s start printed not every CONVERGE_QDRANT_* line: %q", script, out)
	}
	return s, nil
}

// qdrantAlias is an alias and the collection it names.
type qdrantAlias struct {
	AliasName      string `json:"alias_name"`
	CollectionName string `json:"collection_name"`
}

// aliases lists the server's aliases.
func (q Qdrant) aliases(ctx context.Context) ([]qdrantAlias, error) {
	var reply struct {
		Result struct {
			Aliases []qdrantAlias `json:"aliases"`
		} `json:"result"`
	}
	err := q.call(ctx, http.MethodGet, "/aliases", nil, &reply)
	return reply.Result.Aliases, err
}

// AliasTarget is the collection the alias names ("" when it names none).
func (q Qdrant) AliasTarget(ctx context.Context, alias string) (string, error) {
	all, err := q.aliases(ctx)
	for _, a := range all {
		if a.AliasName == alias {
			return a.CollectionName, nil
		}
	}
	return "", err
}

// CollectionExists reports whether the collection exists.
func (q Qdrant) CollectionExists(ctx context.Context, collection string) (bool, error) {
	var reply struct {
		Result struct {
			Exists bool `json:"exists"`
		} `json:"result"`
	}
	err := q.call(ctx, http.MethodGet, "/collections/"+url.PathEscape(collection)+"/exists", nil, &reply)
	return reply.Result.Exists, err
}

// Count is the exact number of the points of collection (or of the
// collection an alias names) that filter, a Qdrant filter, matches.
func (q Qdrant) Count(ctx context.Context, collection string, filter any) (int, error) {
	var reply struct {
		Result struct {
			Count int `json:"count"`
		} `json:"result"`
	}
	err := q.call(ctx, http.MethodPost, "/collections/"+url.PathEscape(collection)+"/points/count", map[string]any{"exact": true, "filter": filter}, &reply)
	return reply.Result.Count, err
}

// dropCollections deletes, through the REST API, the aliases and then the
// collections of q.Collection.
func (q Qdrant) dropCollections() error {
	ctx, cancel := context.WithTimeout(context.Background(), qdrantCleanupTimeout)
	defer cancel()
	aliases, err := q.aliases(ctx)
	if err != nil {
		return err
	}
	var actions []any
	for _, a := range aliases {
		if strings.HasPrefix(a.AliasName, q.Collection) || strings.HasPrefix(a.CollectionName, q.Collection) {
			actions = append(actions, map[string]any{"delete_alias": map[string]string{"alias_name": a.AliasName}})
		}
	}
	if len(actions) > 0 {
		if err := q.call(ctx, http.MethodPost, "/collections/aliases", map[string]any{"actions": actions}, nil); err != nil {
			return err
		}
	}
	var collections struct {
		Result struct {
			Collections []struct {
				Name string `json:"name"`
			} `json:"collections"`
		} `json:"result"`
	}
	if err := q.call(ctx, http.MethodGet, "/collections", nil, &collections); err != nil {
		return err
	}
	var errs []error
	for _, c := range collections.Result.Collections {
		if strings.HasPrefix(c.Name, q.Collection) {
			errs = append(errs, q.call(ctx, http.MethodDelete, "/collections/"+url.PathEscape(c.Name), nil, nil))
		}
	}
	return errors.Join(errs...)
}

// qdrantHTTPError is a REST answer other than 200 OK.
type qdrantHTTPError struct {
	Method, Path string
	StatusCode   int
	Body         string
}

func (e *qdrantHTTPError) Error() string {
	return fmt.Sprintf("qdrant %s %s: %d %s: %s", e.Method, e.Path, e.StatusCode, http.StatusText(e.StatusCode), e.Body)
}

// call sends a REST request with body as JSON, with q.APIKey when set,
// and decodes the answer into reply when not nil.
func (q Qdrant) call(ctx context.Context, method, path string, body, reply any) error {
	var r io.Reader
	if body != nil {
		b, err := json.Marshal(body)
		if err != nil {
			return err
		}
		r = bytes.NewReader(b)
	}
	req, err := http.NewRequestWithContext(ctx, method, q.HTTPURL+path, r)
	if err != nil {
		return err
	}
	if body != nil {
		req.Header.Set("Content-Type", "application/json")
	}
	if q.APIKey != "" {
		req.Header.Set("api-key", q.APIKey)
	}
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		return err
	}
	defer func() { _ = resp.Body.Close() }()
	data, err := io.ReadAll(io.LimitReader(resp.Body, 16<<20))
	if err != nil {
		return err
	}
	if resp.StatusCode != http.StatusOK {
		return &qdrantHTTPError{Method: method, Path: path, StatusCode: resp.StatusCode, Body: string(bytes.TrimSpace(data))}
	}
	if reply == nil {
		return nil
	}
	if err := json.Unmarshal(data, reply); err != nil {
		return fmt.Errorf("qdrant %s %s: %w", method, path, err)
	}
	return nil
}
