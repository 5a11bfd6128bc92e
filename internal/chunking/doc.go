// Package chunking splits a document body into chunks for the pipeline.
//
// Chunk identities downstream derive from (document key, version, ordinal), so
// [Split] is a pure function of the body and the [Config]: it reads no clock,
// locale or map order, and the same input gives the same chunks everywhere.
// Any change to the algorithm below changes chunk ids of existing documents,
// so the algorithm is versioned by [Algorithm]; bump it with every change that
// can move a chunk boundary.
//
// # Algorithm
//
// The chunks are substrings of the body that reassemble it exactly: nothing is
// trimmed or normalised, separators stay inside the chunk they end.
//
//  1. Blocks. The body is read line by line (a line ends after '\n', so "\r\n"
//     stays whole). A new block begins at the first non-blank line after a
//     blank line (a line of only spaces, tabs, '\r' and '\n'), at an ATX
//     heading line (up to three spaces, then 1-6 '#' followed by a space, a
//     tab or the end of the line) and at an opening code fence (up to three
//     spaces, then three or more '`' or '~'). Blank lines belong to the block
//     before them; leading blank lines belong to the first block. A fenced
//     code block runs to its closing fence (same character, at least as long)
//     or to the end of the body, and is one block whatever it contains.
//  2. Packing. Blocks are appended greedily to the current chunk while it
//     stays within TargetBytes; a block that does not fit starts a new chunk.
//     A heading block also starts a new chunk once the current chunk holds at
//     least TargetBytes/4 bytes, so sections tend to begin chunks without
//     producing tiny ones. A block of up to MaxBytes that is larger than
//     TargetBytes becomes a chunk of its own.
//  3. Oversized blocks. A block larger than MaxBytes starts a new chunk and is
//     cut into units, which are packed the same way (without the heading
//     rule): first lines; a line larger than MaxBytes into sentences (ending
//     after ". ", "! " or "? "); a sentence larger than MaxBytes into words
//     (ending after a space or tab); a word larger than MaxBytes is cut to
//     fill chunks up to TargetBytes at the last boundary that does not fall
//     inside a valid UTF-8 sequence (nor between "\r" and "\n").
//
// Every chunk is therefore non-empty and at most MaxBytes long, and never cuts
// a valid UTF-8 sequence. The work is linear in the body size and the only
// allocation is the result slice.
package chunking
