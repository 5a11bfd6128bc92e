// Package textpack stores many strings in one allocation: a store that
// keeps its content in memory packs each item's strings together, so the
// garbage collector marks one object where it would mark one per string.
package textpack

import "strings"

// Pack copies the strings that ss point to into one new string, in order,
// and points each at its copy, a substring of that one allocation. The
// variables may be read again only once Pack returns.
func Pack(ss []*string) {
	n := 0
	for _, s := range ss {
		n += len(*s)
	}
	var b strings.Builder
	b.Grow(n)
	for _, s := range ss {
		b.WriteString(*s)
	}
	all, at := b.String(), 0
	for _, s := range ss {
		end := at + len(*s)
		*s = all[at:end]
		at = end
	}
}
