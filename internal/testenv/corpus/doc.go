// Package corpus generates the documents that converge's tests write.
//
// [Generate] builds a rich corpus deterministically from a seed: keys that
// are hard to carry through URLs, SQL and JSON ([SpecialKeys], a key of
// exactly [contract.MaxKeyBytes] bytes), titles, markdown bodies of
// paragraphs, lists, code and quotes from empty to tens of kilobytes,
// links between keys of the corpus, tags and meta, and for every key a
// sequence of versions that may withdraw it, upsert it again, repeat a
// version's content, or reach [math.MaxInt64]. Each [Op] is one write.
//
// [Sequential] builds plain documents "doc-0", "doc-1", ... whose size and
// shape a [Shape] fixes, for benchmarks and tests that need many similar
// documents; [FilledParagraphs] is a body of a fixed size.
//
// Neither depends on a clock or on global randomness: the same arguments
// give the same documents, so a failure can be replayed.
package corpus
