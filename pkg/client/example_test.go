package client_test

import (
	"context"
	"errors"
	"fmt"
	"log"
	"slices"
	"time"

	"github.com/converge-sync/converge/pkg/client"
	"github.com/converge-sync/converge/pkg/contract"
)

// Store a document, read it back, store the same version again, and
// withdraw it. writerURL is the writer's address (http://127.0.0.1:8080 on
// a laptop's `converge dev`).
func Example() {
	ctx := context.Background()
	c, err := client.New(writerURL, client.WithToken(token))
	if err != nil {
		log.Fatal(err)
	}
	doc := contract.Document{Key: "kb/wal", Version: 1, Title: "The WAL", Body: "Postgres writes ahead.", Tags: []string{"postgres"}}
	res, err := c.Put(ctx, doc)
	if err != nil {
		log.Fatal(err)
	}
	fmt.Println(res.Key, res.Version, res.Result)

	again, _ := c.Put(ctx, doc) // a retry is safe: the version is stored
	fmt.Println(again.Result)

	rec, err := c.Get(ctx, "kb/wal")
	if err != nil {
		log.Fatal(err)
	}
	fmt.Println(rec.Title, rec.Tags)

	doc.Body = "Something else." // the same version with other content
	_, err = c.Put(ctx, doc)
	fmt.Println(errors.Is(err, client.ErrVersionConflict))

	gone, _ := c.Delete(ctx, "kb/wal", 2)
	fmt.Println(gone.Result)
	// Output:
	// kb/wal 1 applied
	// unchanged
	// The WAL [postgres]
	// true
	// applied
}

// Stream a thousand documents in one request; the writer answers each.
func ExampleClient_Batch() {
	c, err := client.New(writerURL, client.WithToken(token))
	if err != nil {
		log.Fatal(err)
	}
	writes := func(yield func(client.Write) bool) {
		for i := range 1000 {
			doc := contract.Document{Key: fmt.Sprintf("batch/%04d", i), Version: 1, Body: "text"}
			if i == 500 {
				doc.Tags = []string{""} // refused: an empty tag
			}
			if !yield(client.Write{Doc: doc}) {
				return
			}
		}
	}
	var refused []int
	stats, err := c.Batch(context.Background(), writes, func(r client.LineResult) error {
		if r.Err != nil {
			refused = append(refused, r.Index)
		}
		return nil
	})
	if err != nil {
		log.Fatal(err)
	}
	slices.Sort(refused)
	fmt.Println(stats.Applied, "applied;", stats.Failed, "refused:", refused)
	// Output: 999 applied; 1 refused: [500]
}

// Errors name the problem; each matches its class with errors.Is.
func ExampleError() {
	c, err := client.New(writerURL, client.WithToken(readToken))
	if err != nil {
		log.Fatal(err)
	}
	_, err = c.Put(context.Background(), contract.Document{Key: "k", Version: 1})
	var e *client.Error
	if errors.As(err, &e) {
		fmt.Println(e.StatusCode, e.Code, errors.Is(err, client.ErrForbidden))
	}
	// Output: 403 forbidden true
}

// Write a document, then search for it at once: the search waits until
// the index projector (its metrics address) holds that version.
func ExampleReader_Search() {
	ctx := context.Background()
	w, _ := client.New(writerURL, client.WithToken(token))
	res, err := w.Put(ctx, contract.Document{Key: "kb/wal", Version: 7, Body: "Postgres writes ahead."})
	if err != nil {
		log.Fatal(err)
	}
	r, _ := client.NewReader("http://127.0.0.1:9103", client.WithToken(readToken))
	hits, err := r.Search(ctx, "write-ahead log", 5, client.After(res), client.Wait(10*time.Second))
	if err != nil {
		log.Fatal(err) // after 10s: a *client.NotYetAppliedError, naming the version the index holds
	}
	for _, h := range hits {
		fmt.Println(h.Key, h.Version, h.Score) // kb/wal among them, at version 7 or newer
	}
}
