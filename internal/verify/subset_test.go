package verify_test

import (
	"context"
	"fmt"
	"sync/atomic"
	"testing"

	"github.com/google/uuid"

	"github.com/converge-sync/converge/internal/index"
	"github.com/converge-sync/converge/internal/verify"
)

// countingIndex is an index of docs that counts the documents whose points
// are read.
type countingIndex struct {
	docs   []verify.Doc
	points atomic.Int64
}

func (c *countingIndex) ScanMarkers(_ context.Context, fn func(index.Marker) error) error {
	for _, d := range c.docs {
		if err := fn(index.Marker{Key: d.Key, Version: d.Version, ContentHash: d.ContentHash}); err != nil {
			return err
		}
	}
	return nil
}

func (c *countingIndex) Points(_ context.Context, key string, _ bool) ([]index.Point, error) {
	c.points.Add(1)
	return []index.Point{{ID: uuid.NewSHA1(uuid.NameSpaceURL, []byte(key)), Key: key, Text: "text of " + key, Title: "t"}}, nil
}

// A projector asked for the digests of a few buckets answers those of
// the same buckets among all of them, and its index reads the points of
// those buckets' documents alone.
func TestDigestsOfAFewBucketsReadOnlyTheirDocuments(t *testing.T) {
	ctx := context.Background()
	idx := &countingIndex{}
	for i := range 500 {
		idx.docs = append(idx.docs, verify.Doc{Key: fmt.Sprintf("doc/%03d", i), Version: 1, ContentHash: "h"})
	}
	addr := serve(t, verify.Handler(verify.Index, func(ctx context.Context) ([]verify.Doc, error) { return verify.ReadIndex(ctx, idx) }))
	remote := &verify.Remote{Label: "index", Addr: addr}
	all, err := remote.Digests(ctx, verify.Index, 64)
	if err != nil {
		t.Fatal(err)
	}
	if n := idx.points.Load(); n != 500 {
		t.Fatalf("all the digests read the points of %d documents, want 500", n)
	}
	idx.points.Store(0)
	some := []int{3, 40, 41}
	got, err := remote.DigestsOf(ctx, verify.Index, 64, some)
	if err != nil {
		t.Fatal(err)
	}
	inBuckets := 0
	for _, b := range some {
		if got[b] != all[b] || got[b].Docs == 0 {
			t.Errorf("bucket %d: %+v, among all %+v", b, got[b], all[b])
		}
		inBuckets += got[b].Docs
	}
	if len(got) != len(some) {
		t.Errorf("%d digests for %d buckets", len(got), len(some))
	}
	if n := idx.points.Load(); n != int64(inBuckets) {
		t.Errorf("the digests of %d buckets read the points of %d documents, want their %d", len(some), n, inBuckets)
	}
	// The documents of a few buckets are read the same way.
	idx.points.Store(0)
	docs, err := remote.Buckets(ctx, verify.Index, 64, some)
	if err != nil {
		t.Fatal(err)
	}
	for _, b := range some {
		if len(docs[b]) != got[b].Docs {
			t.Errorf("bucket %d: %d documents, its digest counts %d", b, len(docs[b]), got[b].Docs)
		}
	}
	if n := idx.points.Load(); n != int64(inBuckets) {
		t.Errorf("the documents of %d buckets read the points of %d documents, want their %d", len(some), n, inBuckets)
	}
}
