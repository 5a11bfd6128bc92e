package writer_test

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"net/http"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"golang.org/x/sync/errgroup"

	"github.com/converge-sync/converge/internal/benchsummary"
	"github.com/converge-sync/converge/internal/writer"
)

// BenchmarkInbox compares, in one run, documents handed over in SQL
// (converge_inbox, 100 per producer transaction, four producers, one
// writer draining) with the same documents POSTed to the batch API (100
// per request, four clients), and measures the latency from a producer's
// commit to the document being stored, against a PUT's round trip, both
// paced at the same rate.
func BenchmarkInbox(b *testing.B) {
	const n, per, clients = 10000, 100, 4
	body := strings.Repeat("A document handed over inside the producer's own transaction. ", 8)
	doc := func(run string, i int) (string, string) {
		key := fmt.Sprintf("bench/%s/%05d", run, i)
		d, _ := json.Marshal(map[string]any{"version": 1, "title": key, "body": body, "tags": []string{"bench"}})
		return key, string(d)
	}
	for range b.N {
		e := newEnv(b)
		ctx, cancel := context.WithCancel(context.Background())
		in := writer.NewInbox(e.pool, e.store, writer.InboxConfig{}, e.metrics, discardLogger())
		drained := make(chan struct{})
		go func() { _ = in.Run(ctx); close(drained) }()

		// The batch API.
		start := time.Now()
		g := errgroup.Group{}
		for c := range clients {
			g.Go(func() error {
				for lo := c * per; lo < n; lo += clients * per {
					var buf bytes.Buffer
					for i := lo; i < lo+per; i++ {
						key, d := doc("http", i)
						fmt.Fprintf(&buf, `{"key":%q,%s`+"\n", key, d[1:])
					}
					resp, err := http.Post(e.srv.URL+"/v1/documents:batch", "application/x-ndjson", &buf)
					if err != nil {
						return err
					}
					resp.Body.Close()
					if resp.StatusCode != http.StatusOK {
						return fmt.Errorf("batch: %d", resp.StatusCode)
					}
				}
				return nil
			})
		}
		if err := g.Wait(); err != nil {
			b.Fatal(err)
		}
		httpRate := float64(n) / time.Since(start).Seconds()

		// The inbox: from the first producer's transaction to the last
		// document stored.
		start = time.Now()
		for c := range clients {
			g.Go(func() error {
				for lo := c * per; lo < n; lo += clients * per {
					keys, docs := make([]string, 0, per), make([]string, 0, per)
					for i := lo; i < lo+per; i++ {
						k, d := doc("sql", i)
						keys, docs = append(keys, k), append(docs, d)
					}
					if _, err := e.pool.Exec(ctx, `INSERT INTO converge_inbox (key, document) SELECT * FROM unnest($1::text[], $2::json[])`, keys, docs); err != nil {
						return err
					}
				}
				return nil
			})
		}
		if err := g.Wait(); err != nil {
			b.Fatal(err)
		}
		for {
			var stored int
			if err := e.pool.QueryRow(ctx, `SELECT count(*) FROM documents WHERE key LIKE 'bench/sql/%'`).Scan(&stored); err != nil {
				b.Fatal(err)
			}
			if stored == n {
				break
			}
			time.Sleep(5 * time.Millisecond)
		}
		sqlRate := float64(n) / time.Since(start).Seconds()
		b.ReportMetric(sqlRate, "inbox_docs/s")
		b.ReportMetric(httpRate, "batch_api_docs/s")
		benchsummary.Log(b, benchsummary.Row{Target: "writer / handed over in SQL (converge_inbox) against the batch API",
			Figure: fmt.Sprintf("%.0f docs/s", sqlRate), Limit: fmt.Sprintf("%.0f docs/s", httpRate),
			Ratio: sqlRate / httpRate, Goal: ">= 0.8", Met: sqlRate/httpRate >= 0.8})

		// Latency, paced at 100 documents a second for 10 seconds: a
		// producer's commit until the document is stored (polled every
		// millisecond), and a PUT's round trip.
		lat := pacedLatency(b, 1000, 100, func(i int) (time.Duration, error) {
			key, d := doc("lat", i)
			if _, err := e.pool.Exec(ctx, `INSERT INTO converge_inbox (key, document) VALUES ($1, $2)`, key, d); err != nil {
				return 0, err
			}
			committed := time.Now()
			for {
				var ok bool
				if err := e.pool.QueryRow(ctx, `SELECT EXISTS (SELECT FROM documents WHERE key = $1)`, key).Scan(&ok); err != nil {
					return 0, err
				}
				if ok {
					return time.Since(committed), nil
				}
				time.Sleep(time.Millisecond)
			}
		}, func(i int) (time.Duration, error) {
			key, d := doc("put", i)
			req, _ := http.NewRequest(http.MethodPut, e.srv.URL+"/v1/documents/"+key, strings.NewReader(d))
			req.Header.Set("Content-Type", "application/json")
			sent := time.Now()
			resp, err := http.DefaultClient.Do(req)
			if err != nil {
				return 0, err
			}
			resp.Body.Close()
			if resp.StatusCode != http.StatusOK {
				return 0, fmt.Errorf("PUT: %d", resp.StatusCode)
			}
			return time.Since(sent), nil
		})
		inbox, put := lat[0], lat[1]
		b.ReportMetric(ms(inbox[len(inbox)/2]), "inbox_p50_ms")
		b.ReportMetric(ms(inbox[len(inbox)*99/100]), "inbox_p99_ms")
		b.Logf("inbox: %d documents at %.0f docs/s handed over in SQL, %d at %.0f docs/s POSTed in batches (%d per transaction or request, %d producers or clients)",
			n, sqlRate, n, httpRate, per, clients)
		b.Logf("latency at 100 docs/s: a producer's commit -> the document stored p50 %.1f ms, p99 %.1f ms (polled every ms); a PUT's round trip p50 %.1f ms, p99 %.1f ms",
			ms(inbox[len(inbox)/2]), ms(inbox[len(inbox)*99/100]), ms(put[len(put)/2]), ms(put[len(put)*99/100]))
		cancel()
		<-drained
	}
}

func ms(d time.Duration) float64 { return float64(d) / float64(time.Millisecond) }

// pacedLatency runs each of sides n times at rate per second, each call in
// a goroutine of its own, and returns each side's latencies, sorted.
func pacedLatency(b *testing.B, n int, rate float64, sides ...func(i int) (time.Duration, error)) [][]time.Duration {
	out := make([][]time.Duration, len(sides))
	for s, side := range sides {
		var mu sync.Mutex
		var g errgroup.Group
		tick := time.NewTicker(time.Duration(float64(time.Second) / rate))
		for i := range n {
			<-tick.C
			g.Go(func() error {
				d, err := side(i)
				mu.Lock()
				out[s] = append(out[s], d)
				mu.Unlock()
				return err
			})
		}
		tick.Stop()
		if err := g.Wait(); err != nil {
			b.Fatal(err)
		}
		slices.Sort(out[s])
	}
	return out
}
