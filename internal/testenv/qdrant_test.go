package testenv

import (
	"context"
	"errors"
	"net"
	"net/http"
	"regexp"
	"slices"
	"strconv"
	"testing"
	"time"

	qd "github.com/qdrant/go-client/qdrant"
)

// Each lease answers over REST and gRPC and has a collection name of its
// own; when its test ends, its collections (a rebuild's <name>_1, _2) and
// their alias <name> are deleted, and another test's collection is not.
func TestLeaseQdrantCleansUpByPrefix(t *testing.T) {
	for _, c := range []struct {
		name  string
		lease func(testing.TB) Qdrant
	}{{"open", LeaseQdrant}, {"keyed", LeaseQdrantKeyed}} {
		t.Run(c.name, func(t *testing.T) {
			t.Parallel()
			ctx := context.Background()
			other := c.lease(t)
			createCollection(t, other, other.Collection+"_1")

			var leased Qdrant
			t.Run("lease", func(t *testing.T) {
				q := c.lease(t)
				leased = q
				if !regexp.MustCompile(`^[a-z0-9_]+$`).MatchString(q.Collection) || q.Collection == other.Collection {
					t.Fatalf("collection name %q (the other lease's: %q): want lowercase letters, digits and _, and distinct", q.Collection, other.Collection)
				}
				if err := q.call(ctx, http.MethodGet, "/readyz", nil, nil); err != nil {
					t.Fatal(err)
				}
				checkGRPC(t, q.URL, q.APIKey)
				createCollection(t, q, q.Collection+"_1")
				createCollection(t, q, q.Collection+"_2")
				if err := q.call(ctx, http.MethodPost, "/collections/aliases", map[string]any{"actions": []any{
					map[string]any{"create_alias": map[string]string{"collection_name": q.Collection + "_2", "alias_name": q.Collection}},
				}}, nil); err != nil {
					t.Fatal(err)
				}
			})

			collections, aliases := listQdrant(t, other)
			for _, name := range []string{leased.Collection + "_1", leased.Collection + "_2"} {
				if slices.Contains(collections, name) {
					t.Errorf("collection %s is left after its test", name)
				}
			}
			if slices.Contains(aliases, leased.Collection) {
				t.Errorf("alias %s is left after its test", leased.Collection)
			}
			if !slices.Contains(collections, other.Collection+"_1") {
				t.Errorf("collection %s of a test still running was deleted", other.Collection+"_1")
			}
		})
	}
}

// The keyed instance refuses a request without a key, and a write with
// the read-only key.
func TestLeaseQdrantKeyedRequiresItsKeys(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	q := LeaseQdrantKeyed(t)
	if q.APIKey == "" || q.ReadOnlyKey == "" || q.APIKey == q.ReadOnlyKey {
		t.Fatalf("keys %q and %q: want two distinct keys", q.APIKey, q.ReadOnlyKey)
	}
	noKey, readOnly := q, q
	noKey.APIKey, readOnly.APIKey = "", q.ReadOnlyKey
	create := map[string]any{"vectors": map[string]any{"size": 4, "distance": "Cosine"}}
	for _, c := range []struct {
		name         string
		as           Qdrant
		method, path string
		body         any
		want         int
	}{
		{"read without a key", noKey, http.MethodGet, "/collections", nil, http.StatusUnauthorized},
		{"read with the read-only key", readOnly, http.MethodGet, "/collections", nil, http.StatusOK},
		{"write with the read-only key", readOnly, http.MethodPut, "/collections/" + q.Collection + "_1", create, http.StatusForbidden},
		{"write with the API key", q, http.MethodPut, "/collections/" + q.Collection + "_1", create, http.StatusOK},
	} {
		err := c.as.call(ctx, c.method, c.path, c.body, nil)
		got := http.StatusOK
		if he := (*qdrantHTTPError)(nil); errors.As(err, &he) {
			got = he.StatusCode
		} else if err != nil {
			t.Fatalf("%s: %v", c.name, err)
		}
		if got != c.want {
			t.Errorf("%s: status %d, want %d (%v)", c.name, got, c.want, err)
		}
	}

	client := grpcClient(t, q.URL, "")
	if _, err := client.ListCollections(ctx); err == nil {
		t.Error("listing collections over gRPC without a key succeeded")
	}
}

func createCollection(t *testing.T, q Qdrant, name string) {
	t.Helper()
	if err := q.call(context.Background(), http.MethodPut, "/collections/"+name,
		map[string]any{"vectors": map[string]any{"size": 4, "distance": "Cosine"}}, nil); err != nil {
		t.Fatal(err)
	}
}

// listQdrant returns the names of the collections and of the aliases.
func listQdrant(t *testing.T, q Qdrant) (collections, aliases []string) {
	t.Helper()
	ctx := context.Background()
	var c struct {
		Result struct {
			Collections []struct {
				Name string `json:"name"`
			} `json:"collections"`
		} `json:"result"`
	}
	if err := q.call(ctx, http.MethodGet, "/collections", nil, &c); err != nil {
		t.Fatal(err)
	}
	for _, x := range c.Result.Collections {
		collections = append(collections, x.Name)
	}
	var a struct {
		Result struct {
			Aliases []struct {
				AliasName string `json:"alias_name"`
			} `json:"aliases"`
		} `json:"result"`
	}
	if err := q.call(ctx, http.MethodGet, "/aliases", nil, &a); err != nil {
		t.Fatal(err)
	}
	for _, x := range a.Result.Aliases {
		aliases = append(aliases, x.AliasName)
	}
	return collections, aliases
}

// checkGRPC asks the gRPC API at addr (host:port) for its health and its
// collections.
func checkGRPC(t *testing.T, addr, apiKey string) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	client := grpcClient(t, addr, apiKey)
	reply, err := client.HealthCheck(ctx)
	if err != nil {
		t.Fatalf("gRPC health check of %s: %v", addr, err)
	}
	if reply.GetVersion() == "" {
		t.Errorf("gRPC health check of %s: no version", addr)
	}
	if _, err := client.ListCollections(ctx); err != nil {
		t.Errorf("listing collections over gRPC at %s: %v", addr, err)
	}
}

func grpcClient(t *testing.T, addr, apiKey string) *qd.Client {
	t.Helper()
	host, portText, err := net.SplitHostPort(addr)
	if err != nil {
		t.Fatalf("gRPC address %q: %v", addr, err)
	}
	port, err := strconv.Atoi(portText)
	if err != nil {
		t.Fatalf("gRPC address %q: %v", addr, err)
	}
	client, err := qd.NewClient(&qd.Config{Host: host, Port: port, APIKey: apiKey, SkipCompatibilityCheck: true, PoolSize: 1})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = client.Close() })
	return client
}
