package writer

import "slices"

func slicesSortByLine(rs []WriteResult) {
	slices.SortStableFunc(rs, func(a, b WriteResult) int { return a.Line - b.Line })
}
