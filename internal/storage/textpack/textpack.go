// Package textpack stores many strings in one allocation: a store that
// keeps its content in memory packs each item's strings together, so the
// garbage collector marks one object where it would mark one per string.
package textpack

import "strings"

// Span is where a string put into a Builder lies in the packed text.
type Span struct{ from, to int }

// Builder collects strings into one text. The zero value is ready.
type Builder struct{ b strings.Builder }

// Grow makes room for n more bytes: growing once to the total keeps the
// text one allocation.
func (b *Builder) Grow(n int) { b.b.Grow(n) }

// Put appends s and returns its span.
func (b *Builder) Put(s string) Span {
	from := b.b.Len()
	b.b.WriteString(s)
	return Span{from, b.b.Len()}
}

// Text ends the packing: the returned function gives the string of a span,
// a substring of the one packed text. Put must not be called afterwards.
func (b *Builder) Text() func(Span) string {
	all := b.b.String()
	return func(s Span) string { return all[s.from:s.to] }
}
