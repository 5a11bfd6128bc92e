package stack_test

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"sync"
	"testing"
	"time"

	"github.com/converge-sync/converge/internal/atleast"
	"github.com/converge-sync/converge/internal/graph"
	"github.com/converge-sync/converge/internal/index"
	"github.com/converge-sync/converge/pkg/client"
	"github.com/converge-sync/converge/pkg/contract"
)

// Read your writes, on the whole pipeline under a load of other writes: a
// producer writes a document, then at once searches for it and reads it
// from the graph with after= what the writer answered, 120 times. Every
// answer holds that version or a newer one: never stale. The waits'
// quantiles are logged.
func TestReadYourWritesIsNeverStale(t *testing.T) {
	if testing.Short() {
		t.Skip("starts the whole pipeline")
	}
	ctx, cancel := context.WithTimeout(context.Background(), 4*time.Minute)
	defer cancel()
	s := startStack(t, ctx)
	wc, err := client.New(s.APIURL, client.WithToken(s.WriterToken))
	if err != nil {
		t.Fatal(err)
	}

	// The load: other documents, written without pause meanwhile.
	loadCtx, stopLoad := context.WithCancel(ctx)
	var load sync.WaitGroup
	load.Add(1)
	go func() {
		defer load.Done()
		for i := 0; loadCtx.Err() == nil; i++ {
			_, _ = wc.Put(loadCtx, contract.Document{Key: fmt.Sprintf("load/%03d", i%200), Version: int64(i + 1),
				Title: "load", Body: fmt.Sprintf("A document of the load, number %d, with some words to chunk.", i)})
		}
	}()
	defer func() { stopLoad(); load.Wait() }()

	const rounds = 120
	var searchWaits, graphWaits []time.Duration
	applied := scrapeProjector(t, s.IndexAddr).latency
	for i := range rounds {
		body := fmt.Sprintf("read your writes round %d of the check, word%d", i, i*7919)
		res, err := wc.Put(ctx, contract.Document{Key: fmt.Sprintf("ryw/%02d", i%12), Version: int64(i + 1), Title: "ryw", Body: body})
		if err != nil {
			t.Fatal(err)
		}
		want, err := atleast.ParseWrite(res.After())
		if err != nil {
			t.Fatal(err)
		}
		start := time.Now()
		// The body itself as the query: the hash embedder gives it the
		// very vector of the document's one chunk.
		found, err := (&index.Client{Addr: s.IndexAddr, Token: s.OperatorToken, After: []atleast.Write{want}, Wait: 30 * time.Second}).Search(ctx, body, 3)
		if err != nil {
			t.Fatalf("round %d: search after %s: %v", i, res.After(), err)
		}
		searchWaits = append(searchWaits, time.Since(start))
		if len(found.Results) == 0 || found.Results[0].Key != res.Key || found.Results[0].Version < res.Version {
			t.Fatalf("round %d: search after %s answered %+v: stale", i, res.After(), found.Results)
		}
		start = time.Now()
		d, err := (&graph.Client{Addr: s.GraphAddr, Token: s.OperatorToken, After: []atleast.Write{want}, Wait: 30 * time.Second}).Document(ctx, res.Key)
		if err != nil {
			t.Fatalf("round %d: graph after %s: %v", i, res.After(), err)
		}
		graphWaits = append(graphWaits, time.Since(start))
		if d.Version < res.Version {
			t.Fatalf("round %d: graph after %s answered version %d: stale", i, res.After(), d.Version)
		}
	}
	q := func(ds []time.Duration, p int) time.Duration {
		slices.Sort(ds)
		return ds[len(ds)*p/100].Round(100 * time.Microsecond)
	}
	lat, err := scrapeProjector(t, s.IndexAddr).latency.minus(applied)
	if err != nil {
		t.Fatal(err)
	}
	ms := func(sec float64) time.Duration {
		return time.Duration(sec * float64(time.Second)).Round(100 * time.Microsecond)
	}
	t.Logf("%d writes each read at once, never stale: search with after= p50 %v p99 %v; graph read after the search p50 %v p99 %v; "+
		"meanwhile the index projector's commit -> applied (its histogram, %d events with the load's) p50 %v p99 %v",
		rounds, q(searchWaits, 50), q(searchWaits, 99), q(graphWaits, 50), q(graphWaits, 99), int(lat.count), ms(lat.quantile(0.5)), ms(lat.quantile(0.99)))

	// A write the index does not hold within the wait: a clear error that
	// says how far it is.
	_, err = (&index.Client{Addr: s.IndexAddr, Token: s.OperatorToken, After: []atleast.Write{{Key: "ryw/00", Version: 1 << 40}}, Wait: 50 * time.Millisecond}).Search(ctx, "x", 1)
	var ae *index.APIError
	if !errors.As(err, &ae) || ae.Code != "not_yet_applied" || ae.StatusCode != 503 {
		t.Fatalf("a write never made: %v, want 503 not_yet_applied", err)
	}
}
