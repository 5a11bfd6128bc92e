package postgres_test

import (
	"context"
	"fmt"
	"os"
	"slices"
	"strings"
	"testing"

	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/converge-sync/converge/internal/docstore"
	"github.com/converge-sync/converge/internal/testenv"
	"github.com/converge-sync/converge/internal/verify"
	"github.com/converge-sync/converge/internal/verify/postgres"
	"github.com/converge-sync/converge/pkg/contract"
)

var pg *testenv.Postgres

func TestMain(m *testing.M) { os.Exit(testenv.RunMain(m, &pg)) }

func setup(t *testing.T) *pgxpool.Pool {
	t.Helper()
	pool, err := pgxpool.New(context.Background(), pg.MigratedDatabase(t))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(pool.Close)
	store, err := docstore.New(pool, docstore.Config{}, nil)
	if err != nil {
		t.Fatal(err)
	}
	var writes []docstore.Write
	for i := range 300 {
		key := fmt.Sprintf("doc/%d é", i) // not ASCII: keys compare as bytes on both sides
		writes = append(writes, docstore.Write{Doc: contract.Document{Key: key, Version: 1, Title: "t",
			Body:  fmt.Sprintf("Body of %d.\n\nSecond paragraph of %d.", i, i),
			Links: []string{fmt.Sprintf("doc/%d é", (i+1)%300), "Zed", "alpha"}, Tags: []string{"b", "A"}}})
	}
	for i := 0; i < 300; i += 10 {
		writes = append(writes, docstore.Write{Withdraw: true, Doc: contract.Document{Key: fmt.Sprintf("doc/%d é", i), Version: 2}})
	}
	for lo := 0; lo < len(writes); lo += 100 {
		outs, err := store.Apply(context.Background(), writes[lo:min(lo+100, len(writes))])
		if err != nil {
			t.Fatal(err)
		}
		for _, o := range outs {
			if o.Err != nil {
				t.Fatal(o.Err)
			}
		}
	}
	return pool
}

// The digests computed in SQL equal those computed in Go from the same
// documents read back: the two implementations of the canonical line agree.
func TestSQLDigestsMatchGo(t *testing.T) {
	pool := setup(t)
	truth := &postgres.Postgres{Pool: pool}
	for _, kind := range []verify.Kind{verify.Index, verify.Graph} {
		for _, n := range []int{1, 7, 1024} {
			sql, err := truth.Digests(context.Background(), kind, n)
			if err != nil {
				t.Fatal(err)
			}
			all := make([]int, n)
			for i := range all {
				all[i] = i
			}
			byBucket, err := truth.Buckets(context.Background(), kind, n, all)
			if err != nil {
				t.Fatal(err)
			}
			var docs []verify.Doc
			total := 0
			for b, ds := range byBucket {
				for _, d := range ds {
					if verify.Bucket(d.Key, n) != b {
						t.Fatalf("%s is in bucket %d by SQL, %d by Go", d.Key, b, verify.Bucket(d.Key, n))
					}
				}
				docs = append(docs, ds...)
				total += len(ds)
			}
			if total != 300 {
				t.Fatalf("%d documents read back, want 300", total)
			}
			goDigests := verify.Digests(kind, n, docs)
			for b := range n {
				if sql[b] != goDigests[b] {
					t.Fatalf("%s, %d buckets: bucket %d: SQL %+v, Go %+v", kind, n, b, sql[b], goDigests[b])
				}
			}
		}
	}
}

// Compare finds each kind of difference, on exactly the documents that
// differ, and nothing when the sides agree.
func TestCompareNamesEachDifference(t *testing.T) {
	pool := setup(t)
	truth := &postgres.Postgres{Pool: pool}
	ctx := context.Background()
	for _, kind := range []verify.Kind{verify.Index, verify.Graph} {
		all := make([]int, 16)
		for i := range all {
			all[i] = i
		}
		byBucket, err := truth.Buckets(ctx, kind, 16, all)
		if err != nil {
			t.Fatal(err)
		}
		var docs []verify.Doc
		for _, ds := range byBucket {
			docs = append(docs, ds...)
		}
		// Live documents first, in key order: the damage below is then done
		// to documents that have chunks and links, on every run.
		slices.SortFunc(docs, func(a, b verify.Doc) int {
			if a.Deleted != b.Deleted {
				if a.Deleted {
					return 1
				}
				return -1
			}
			return strings.Compare(a.Key, b.Key)
		})
		rep, err := verify.Compare(ctx, truth, &verify.Memory{Label: "copy", Docs: docs}, kind, verify.DefaultBuckets, nil)
		if err != nil {
			t.Fatal(err)
		}
		if !rep.Agrees || len(rep.Differences) != 0 || rep.Documents != 300 || rep.DifferingBuckets != 0 {
			t.Fatalf("%s: an exact copy: %+v", kind, rep)
		}

		want := map[string]string{}
		var damaged []verify.Doc
		for i, d := range docs {
			switch i {
			case 0:
				want[d.Key] = verify.Missing
				continue
			case 1:
				d.Version--
				want[d.Key] = verify.StaleVersion
			case 2:
				d.Version++
				want[d.Key] = verify.VersionMismatch
			case 3:
				d.ContentHash = "other"
				want[d.Key] = verify.ContentMismatch
			case 4:
				if len(d.Chunks) > 0 {
					d.Chunks = d.Chunks[:len(d.Chunks)-1]
					want[d.Key] = verify.StaleChunks
				}
			case 5:
				if kind == verify.Graph && !d.Deleted {
					d.Links = d.Links[1:]
					want[d.Key] = verify.LinksMismatch
				}
			}
			damaged = append(damaged, d)
		}
		damaged = append(damaged, verify.Doc{Key: "ghost", Version: 9})
		want["ghost"] = verify.Extra
		if kinds := len(want); kind == verify.Graph && kinds != 7 || kind == verify.Index && kinds != 6 {
			t.Fatalf("%s: only %d kinds of damage were done: %v", kind, kinds, want)
		}
		rep, err = verify.Compare(ctx, truth, &verify.Memory{Label: "damaged", Docs: damaged}, kind, verify.DefaultBuckets, nil)
		if err != nil {
			t.Fatal(err)
		}
		got := map[string]string{}
		for _, d := range rep.Differences {
			got[d.Key] = d.Problem
		}
		if rep.Agrees || fmt.Sprint(got) != fmt.Sprint(want) {
			t.Fatalf("%s: differences %v, want %v", kind, got, want)
		}
	}
}
