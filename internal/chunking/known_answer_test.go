package chunking

import (
	"slices"
	"testing"
)

// TestSplitKnownAnswer pins the output of Algorithm on a fixed body. If it
// fails, the algorithm changed: chunk ids of stored documents change with it,
// so bump Algorithm together with the expected chunks below.
func TestSplitKnownAnswer(t *testing.T) {
	if Algorithm != "converge.chunking.v1" {
		t.Fatalf("Algorithm = %q; update the expected chunks with it", Algorithm)
	}
	body := "# Converge\n\n" +
		"Converge keeps documents in sync.\n\n" +
		"## Install\nRun the installer, then restart.\n\n" +
		"```sh\nmake install\n\nmake test\n```\n\n" +
		"- one\n- two\n\n" +
		"## 日本語\r\n\r\n" +
		"東京は日本の首都です。大阪は二番目です。\r\n\r\n" +
		"## Notes\nFirst sentence here. Second sentence is somewhat longer than the first! Third? Yes. Done and dusted.\n\n" +
		"x😀😀😀😀😀😀😀😀😀😀😀😀😀😀😀😀😀😀😀😀😀😀😀😀😀\n\n" +
		"https://example.com/aaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaa\n"
	want := []string{
		"# Converge\n\nConverge keeps documents in sync.\n\n",
		"## Install\nRun the installer, then restart.\n\n",
		"```sh\nmake install\n\nmake test\n```\n\n- one\n- two\n\n",
		"## 日本語\r\n\r\n",
		"東京は日本の首都です。大阪は二番目です。\r\n\r\n",
		"## Notes\nFirst sentence here. ",
		"Second sentence is somewhat longer than the first! Third? Yes. ",
		"Done and dusted.\n\n",
		"x😀😀😀😀😀😀😀😀😀😀😀😀😀😀😀",
		"😀😀😀😀😀😀😀😀😀😀\n\n",
		"https://example.com/aaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaa",
		"aaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaa",
		"aaa\n",
	}
	cfg := Config{TargetBytes: 64, MaxBytes: 96}
	got := Split(body, cfg)
	if !slices.Equal(got, want) {
		for i, c := range got {
			t.Logf("got[%d] = %q", i, c)
		}
		t.Fatalf("Split changed: got %d chunks, want %d", len(got), len(want))
	}
	checkChunks(t, body, cfg, got)
}
