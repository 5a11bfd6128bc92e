package corpus

import (
	"encoding/json"
	"fmt"
	"strings"

	"github.com/converge-sync/converge/internal/chunking"
	"github.com/converge-sync/converge/pkg/contract"
)

// Shape is what the documents of [Sequential] hold. The zero Shape gives
// keys "doc-<i>" at version 1 and nothing else.
type Shape struct {
	First   int                  // index of the first document (0 when unset)
	Keys    string               // key of document i: a fmt format with one %d; "doc-%d" when empty
	Version int64                // 1 when 0
	Title   func(i int) string   // nil: no title
	Body    func(i int) string   // nil: no body
	Links   func(i int) []string // nil: no links
	Tags    func(i int) []string // nil: no tags
	Meta    json.RawMessage
}

// Key is the key of document i.
func (s Shape) Key(i int) string {
	if s.Keys == "" {
		return fmt.Sprintf("doc-%d", i)
	}
	return fmt.Sprintf(s.Keys, i)
}

// Sequential returns n normalized documents of shape s, for document
// indexes s.First to s.First+n-1. It panics if s makes an invalid document:
// that is a mistake of the calling test.
func Sequential(n int, s Shape) []contract.Document {
	version := s.Version
	if version == 0 {
		version = 1
	}
	docs := make([]contract.Document, n)
	for j := range docs {
		i := s.First + j
		d := contract.Document{Key: s.Key(i), Version: version, Meta: s.Meta}
		if s.Title != nil {
			d.Title = s.Title(i)
		}
		if s.Body != nil {
			d.Body = s.Body(i)
		}
		if s.Links != nil {
			d.Links = s.Links(i)
		}
		if s.Tags != nil {
			d.Tags = s.Tags(i)
		}
		norm, err := d.Normalize()
		if err != nil {
			panic(fmt.Sprintf("corpus: shape makes document %d invalid: %v", i, err))
		}
		docs[j] = norm
	}
	return docs
}

// Fixed is v for every document: Title: Fixed("bench").
func Fixed[T any](v T) func(i int) T { return func(int) T { return v } }

// FilledParagraphs is a body of paragraphs paragraphs, the p-th ending
// (with a blank line) once the body holds (p+1)*size bytes, of the given
// words separated by spaces; document i starts each paragraph at another
// word, so that bodies differ. With size 1000 and chunking's default
// configuration each paragraph is one chunk.
func FilledParagraphs(paragraphs, size int, words ...string) func(i int) string {
	return func(i int) string {
		var body strings.Builder
		for p := range paragraphs {
			for w := 0; body.Len() < (p+1)*size; w++ {
				body.WriteString(words[(i*7+p*3+w)%len(words)])
				body.WriteByte(' ')
			}
			body.WriteString("\n\n")
		}
		return body.String()
	}
}

// UpsertedEvents are the events of upserting docs, chunked as the writer
// chunks them (chunking.DefaultConfig).
func UpsertedEvents(docs []contract.Document) []contract.Event {
	evs := make([]contract.Event, len(docs))
	for i, d := range docs {
		evs[i] = contract.NewUpsertedEvent(d, chunking.Split(d.Body, chunking.DefaultConfig()))
	}
	return evs
}
