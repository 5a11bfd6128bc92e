package verify

import (
	"context"
	"errors"
	"fmt"
	"net/http"
	"net/url"
	"slices"
	"strconv"
	"strings"
	"time"

	"github.com/converge-sync/converge/internal/auth"
	"github.com/converge-sync/converge/internal/embed"
	"github.com/converge-sync/converge/internal/httpjson"
)

// MaxBuckets bounds the number of buckets of a request.
const MaxBuckets = 1 << 16

// digestsJSON is the answer of GET /v1/verify/digests.
type digestsJSON struct {
	Kind    Kind           `json:"kind"`
	Buckets []BucketDigest `json:"buckets"`
	// Embedder made the vectors of the index's live generation.
	Embedder *embed.Identity `json:"embedder,omitempty"`
	// Only lists the buckets asked for with b= (the others are left
	// zero); absent: every bucket's digest.
	Only []int `json:"only,omitempty"`
}

// HandlerOption adds to what [Handler] answers.
type HandlerOption func(*handlerOptions)

type handlerOptions struct {
	embedder *embed.Identity
}

// WithEmbedder adds the embedder of the store's vectors (the index's) to
// the digests' answer.
func WithEmbedder(id embed.Identity) HandlerOption {
	return func(o *handlerOptions) { o.embedder = &id }
}

// Handler serves a projection's side of verify, read from its store by the
// process that owns it:
//
//	GET /v1/verify/digests?buckets=N        the digest of each of N buckets
//	GET /v1/verify/digests?buckets=N&b=1,7  the digests of buckets 1 and 7 alone
//	GET /v1/verify/buckets?buckets=N&b=1,7  the documents of buckets 1 and 7
//
// read is called once per request; with b=, its context carries the
// buckets asked for, so that [ReadIndex] and [ReadGraph] read only their
// documents.
func Handler(kind Kind, read func(context.Context) ([]Doc, error), opts ...HandlerOption) http.Handler {
	var o handlerOptions
	for _, opt := range opts {
		opt(&o)
	}
	mux := http.NewServeMux()
	mux.HandleFunc("GET /v1/verify/digests", func(w http.ResponseWriter, r *http.Request) {
		n, ok := bucketsParam(w, r)
		if !ok {
			return
		}
		ctx := r.Context()
		var only []int
		if r.URL.Query().Has("b") {
			if only, ok = bucketList(w, r, n); !ok {
				return
			}
			ctx = withBuckets(ctx, n, only)
		}
		docs, err := read(ctx)
		if err != nil {
			httpError(w, http.StatusServiceUnavailable, err.Error())
			return
		}
		httpjson.Write(w, http.StatusOK, digestsJSON{Kind: kind, Buckets: Digests(kind, n, docs), Embedder: o.embedder, Only: only})
	})
	mux.HandleFunc("GET /v1/verify/buckets", func(w http.ResponseWriter, r *http.Request) {
		n, ok := bucketsParam(w, r)
		if !ok {
			return
		}
		want, ok := bucketList(w, r, n)
		if !ok {
			return
		}
		docs, err := read(withBuckets(r.Context(), n, want))
		if err != nil {
			httpError(w, http.StatusServiceUnavailable, err.Error())
			return
		}
		out, _ := (&Memory{Docs: docs}).Buckets(r.Context(), kind, n, want)
		httpjson.Write(w, http.StatusOK, out)
	})
	return mux
}

func bucketsParam(w http.ResponseWriter, r *http.Request) (int, bool) {
	n, err := strconv.Atoi(r.URL.Query().Get("buckets"))
	if err != nil || n < 1 || n > MaxBuckets {
		httpError(w, http.StatusBadRequest, fmt.Sprintf("buckets must be an integer from 1 to %d", MaxBuckets))
		return 0, false
	}
	return n, true
}

// bucketList is the b= parameter: buckets of n, comma-separated.
func bucketList(w http.ResponseWriter, r *http.Request, n int) ([]int, bool) {
	var want []int
	for _, s := range strings.Split(r.URL.Query().Get("b"), ",") {
		b, err := strconv.Atoi(s)
		if err != nil || b < 0 || b >= n {
			httpError(w, http.StatusBadRequest, fmt.Sprintf("b must list buckets from 0 to %d, got %q", n-1, s))
			return nil, false
		}
		want = append(want, b)
	}
	return want, true
}

func httpError(w http.ResponseWriter, status int, msg string) {
	httpjson.Error(w, status, "verify", msg)
}

// Remote is a projection's side of verify, asked of the projector that
// owns the store over HTTP or HTTPS (its metrics address).
type Remote struct {
	Label string // "index" or "graph"
	// Addr is host:port (plain HTTP) or an http:// or https:// URL.
	Addr string
	// Token is sent as a bearer token (the read scope); empty: none. It
	// is refused over plain HTTP beyond loopback unless InsecurePlainHTTP.
	Token             string
	InsecurePlainHTTP bool
	// Client defaults to one with a 5-minute timeout: a projector reads
	// its whole store to answer. Its transport trusts the CA of an
	// https:// Addr's certificate.
	Client *http.Client

	embedder *embed.Identity // of the last digests' answer
}

// Embedder is the embedder the projector named in its last answer of
// digests (the index's), nil if none.
func (r *Remote) Embedder() *embed.Identity { return r.embedder }

// Name implements Side.
func (r *Remote) Name() string { return r.Label }

// Digests implements Side.
func (r *Remote) Digests(ctx context.Context, kind Kind, n int) ([]BucketDigest, error) {
	var out digestsJSON
	if err := r.get(ctx, "/v1/verify/digests", url.Values{"buckets": {strconv.Itoa(n)}}, &out); err != nil {
		return nil, err
	}
	if out.Kind != kind || len(out.Buckets) != n {
		return nil, fmt.Errorf("%s at %s answered %d %s digests, want %d %s", r.Label, r.Addr, len(out.Buckets), out.Kind, n, kind)
	}
	r.embedder = out.Embedder
	return out.Buckets, nil
}

// DigestsOf implements [BucketDigester]: the projector reads the
// documents of those buckets alone. A projector that predates b= answers
// every bucket's digest, which serves as well.
func (r *Remote) DigestsOf(ctx context.Context, kind Kind, n int, buckets []int) (map[int]BucketDigest, error) {
	var out digestsJSON
	if err := r.get(ctx, "/v1/verify/digests", url.Values{"buckets": {strconv.Itoa(n)}, "b": {bucketsText(buckets)}}, &out); err != nil {
		return nil, err
	}
	if out.Kind != kind || len(out.Buckets) != n {
		return nil, fmt.Errorf("%s at %s answered %d %s digests, want %d %s", r.Label, r.Addr, len(out.Buckets), out.Kind, n, kind)
	}
	r.embedder = out.Embedder
	got := make(map[int]BucketDigest, len(buckets))
	for _, b := range buckets {
		if out.Only != nil && !slices.Contains(out.Only, b) {
			return nil, fmt.Errorf("%s at %s did not answer bucket %d", r.Label, r.Addr, b)
		}
		got[b] = out.Buckets[b]
	}
	return got, nil
}

func bucketsText(buckets []int) string {
	bs := make([]string, len(buckets))
	for i, b := range buckets {
		bs[i] = strconv.Itoa(b)
	}
	return strings.Join(bs, ",")
}

// Buckets implements Side.
func (r *Remote) Buckets(ctx context.Context, _ Kind, n int, buckets []int) (map[int][]Doc, error) {
	out := map[int][]Doc{}
	err := r.get(ctx, "/v1/verify/buckets", url.Values{"buckets": {strconv.Itoa(n)}, "b": {bucketsText(buckets)}}, &out)
	return out, err
}

func (r *Remote) get(ctx context.Context, path string, q url.Values, v any) error {
	c := r.Client
	if c == nil {
		c = &http.Client{Timeout: 5 * time.Minute}
	}
	u, err := auth.Endpoint{Addr: r.Addr, Token: r.Token, InsecurePlainHTTP: r.InsecurePlainHTTP}.URL(path, q)
	if err != nil {
		return fmt.Errorf("the %s projector: %w", r.Label, err)
	}
	// A bucket's documents may be many: the answer's bound is generous.
	err = httpjson.Get(ctx, c, u, r.Token, 1<<30, v)
	if errors.Is(err, httpjson.ErrNoAnswer) {
		return fmt.Errorf("the %s projector at %s does not answer: %w", r.Label, r.Addr, err)
	}
	if err != nil {
		return fmt.Errorf("the %s projector at %s: %w", r.Label, r.Addr, err)
	}
	return nil
}
