package main

import (
	"bytes"
	"io"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"
)

func TestIsTerminal(t *testing.T) {
	f, err := os.Create(filepath.Join(t.TempDir(), "log"))
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	r, w, err := os.Pipe()
	if err != nil {
		t.Fatal(err)
	}
	defer r.Close()
	defer w.Close()
	for name, out := range map[string]io.Writer{"a buffer": &bytes.Buffer{}, "a file": f, "a pipe": w} {
		if isTerminal(out) {
			t.Errorf("%s is taken for a terminal", name)
		}
	}
	// A character device is what a terminal is to Stat.
	dev, err := os.OpenFile(os.DevNull, os.O_WRONLY, 0)
	if err != nil {
		t.Fatal(err)
	}
	defer dev.Close()
	if !isTerminal(dev) {
		t.Errorf("%s, a character device, is not taken for a terminal", os.DevNull)
	}
}

// Not on a terminal, each update is a plain line, written when it changed
// and at most once every progressEvery; Done writes the last one.
func TestProgressLineOffTerminal(t *testing.T) {
	var out bytes.Buffer
	now := time.Date(2026, 1, 1, 0, 0, 0, 0, time.UTC)
	p := newProgressLine(&out)
	p.now = func() time.Time { return now }
	if p.tty {
		t.Fatal("a buffer is taken for a terminal")
	}
	step := func(d time.Duration, line string) {
		now = now.Add(d)
		p.Update(line)
	}
	step(0, "applied 1 of 9")
	step(time.Second, "applied 2 of 9") // held back
	step(time.Second, "applied 3 of 9") // held back, replaces 2
	step(4*time.Second, "applied 4 of 9")
	step(2*time.Second, "applied 4 of 9") // unchanged
	step(time.Second, "applied 5 of 9")   // held back
	p.Printf("asking again\n")
	step(time.Second, "applied 9 of 9") // held back
	p.Done()
	want := "applied 1 of 9\napplied 4 of 9\nasking again\napplied 9 of 9\n"
	if out.String() != want {
		t.Fatalf("progress:\n%q\nwant\n%q", out.String(), want)
	}
}

// On a terminal the line is rewritten in place, over the whole of a longer
// previous one, and Done ends it.
func TestProgressLineOnTerminal(t *testing.T) {
	var out bytes.Buffer
	p := newProgressLine(&out)
	p.tty = true
	p.Update("applied 10 of 99")
	p.Update("applied 10 of 99")
	p.Update("done 99")
	p.Printf("note\n")
	p.Update("again")
	p.Done()
	want := "\rapplied 10 of 99\rdone 99         \nnote\n\ragain\n"
	if out.String() != want {
		t.Fatalf("progress:\n%q\nwant\n%q", out.String(), want)
	}
	if strings.Count(out.String(), "\n") != 3 {
		t.Fatalf("lines: %q", out.String())
	}
}
