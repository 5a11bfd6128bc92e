package contract_test

import (
	"encoding/json"
	"strings"
	"testing"

	"github.com/converge-sync/converge/pkg/contract"
)

// benchBodies are ~1 KB bodies: markdown prose as the writer's benchmark
// generates, and text dense with characters JSON escapes or that are not
// ASCII.
var benchBodies = []struct{ name, para string }{
	{"prose", "# Getting started\n\nThe writer stores each document version with its chunks and an event " +
		"in one transaction so that projections never miss a change and replays are idempotent because every " +
		"identifier derives from the key, the version and the position of a chunk within the body.\n\n"},
	{"dense", "Converge keeps <documents> & their chunks in step; \"quoted\" text, tabs\tand newlines\n" +
		"with a little non-ASCII: café, naïve, 日本語. "},
}

// benchDocument is a normalised document with a ~1 KB body, split in two
// chunks, as the writer sees it.
func benchDocument(b *testing.B, para string) (contract.Document, []string) {
	b.Helper()
	body := strings.Repeat(para, 1024/len(para)+1)[:1024]
	for !strings.HasSuffix(body, " ") { // keep the cut on a rune boundary
		body = body[:len(body)-1]
	}
	d, err := contract.Document{
		Key: "kb/3f2a91c0/getting-started.md", Version: 7, Title: "Getting started with the writer",
		Body:  body,
		Links: []string{"kb/1c9e4a77/page.md", "kb/8d02f3b1/page.md", "kb/e4b7a210/page.md"},
		Tags:  []string{"guide", "docs"},
		Meta:  json.RawMessage(`{"source": "wiki", "lang": "en", "author": {"name": "user42", "team": "docs"}, "revision": 317, "path": ["kb", "writer"]}`),
	}.Normalize()
	if err != nil {
		b.Fatal(err)
	}
	half := len(body) / 2
	for !strings.HasPrefix(body[half:], " ") {
		half++
	}
	return d, []string{body[:half], body[half:]}
}

func BenchmarkEncode(b *testing.B) {
	for _, bb := range benchBodies {
		b.Run(bb.name, func(b *testing.B) {
			d, chunks := benchDocument(b, bb.para)
			ev := contract.NewUpsertedEvent(d, chunks)
			b.ReportAllocs()
			for b.Loop() {
				if _, err := ev.Encode(); err != nil {
					b.Fatal(err)
				}
			}
		})
	}
}

func BenchmarkContentHash(b *testing.B) {
	for _, bb := range benchBodies {
		b.Run(bb.name, func(b *testing.B) {
			d, _ := benchDocument(b, bb.para)
			b.ReportAllocs()
			for b.Loop() {
				_ = contract.ContentHash(d)
			}
		})
	}
}

func BenchmarkCanonicalMeta(b *testing.B) {
	raw := json.RawMessage(`{"source": "wiki", "lang": "en", "author": {"name": "user42", "team": "docs"}, "revision": 317, "path": ["kb", "writer"]}`)
	b.ReportAllocs()
	for b.Loop() {
		if _, err := contract.CanonicalMeta(raw); err != nil {
			b.Fatal(err)
		}
	}
}

func BenchmarkNormalize(b *testing.B) {
	d, _ := benchDocument(b, benchBodies[0].para)
	d.Meta = json.RawMessage(`{"source": "wiki", "lang": "en", "author": {"name": "user42", "team": "docs"}, "revision": 317, "path": ["kb", "writer"]}`)
	b.ReportAllocs()
	for b.Loop() {
		if _, err := d.Normalize(); err != nil {
			b.Fatal(err)
		}
	}
}

func BenchmarkDecodeEvent(b *testing.B) {
	d, chunks := benchDocument(b, benchBodies[0].para)
	data, err := contract.NewUpsertedEvent(d, chunks).Encode()
	if err != nil {
		b.Fatal(err)
	}
	b.ReportAllocs()
	for b.Loop() {
		if _, err := contract.DecodeEvent(data); err != nil {
			b.Fatal(err)
		}
	}
}
