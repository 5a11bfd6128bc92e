package client

import (
	"bufio"
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"iter"
	"net/http"
	"sync"
	"time"
)

// Write is one line of a batch: Doc to store, or, with Withdraw, the
// withdrawal of Doc.Key at Doc.Version (the rest of Doc unused).
type Write struct {
	Doc      Document
	Withdraw bool
}

// LineResult is the answer to one [Write] of a batch.
type LineResult struct {
	// Index is the write's position in the batch's input, from 0.
	Index int
	// Result is the write's outcome when Err is nil.
	Result
	// Err is the line's refusal, an [*Error] with its Line and Code.
	Err error
}

// BatchStats counts a batch's answers.
type BatchStats struct {
	Lines                     int // lines answered
	Applied, Unchanged, Stale int
	Failed                    int // lines refused
	Requests                  int // requests sent: more than 1 when lines were sent again
	Resent                    int // lines sent again after the writer had not answered them
}

// Batch streams writes to the writer as NDJSON (POST /v1/documents:batch)
// and calls onResult with the answer to each, as the writer answers them
// (a line sent again is answered after the lines behind it; Index tells
// which it is). onResult runs on the calling goroutine, one at a time; an
// error from it ends the batch.
//
// Writes are pulled from the sequence only as fast as the writer reads
// them: the connection's flow control holds the rest, so a slow writer
// slows the producer down instead of filling its memory. The lines sent
// and not yet answered are kept to be sent again: when the writer's store
// fails, the writer answers that transaction's lines store_unavailable and
// reads no further, and when the connection breaks nothing more is
// answered. Those lines, and the input after them, then go in a new
// request, after the backoff of [WithRetry] (its attempts count the
// failures in a row; a request that was answered starts them again).
// Sending a line again is safe: writes are versioned.
func (c *Client) Batch(ctx context.Context, writes iter.Seq[Write], onResult func(LineResult) error) (BatchStats, error) {
	next, stop := iter.Pull(writes)
	defer stop()
	b := &batch{c: c, ctx: ctx, next: next, onResult: onResult}
	failures := 0
	for {
		answered, err := b.request()
		b.stats.Requests++
		if err == nil {
			return b.stats, nil
		}
		if !retryable(err) || ctx.Err() != nil {
			return b.stats, err
		}
		if answered > 0 {
			failures = 0
		}
		failures++
		if failures >= c.retry.Attempts {
			return b.stats, fmt.Errorf("client: batch: %d lines unanswered after %d attempts in a row: %w", len(b.resend), failures, err)
		}
		b.stats.Resent += len(b.resend)
		t := time.NewTimer(c.backoff(failures))
		select {
		case <-ctx.Done():
			t.Stop()
			return b.stats, errors.Join(err, ctx.Err())
		case <-t.C:
		}
	}
}

type batch struct {
	c        *Client
	ctx      context.Context
	next     func() (Write, bool)
	srcDone  bool
	index    int          // the input's next index
	resend   []*batchLine // to send first in the next request, in input order
	onResult func(LineResult) error
	stats    BatchStats
}

// batchLine is a line of the batch's input.
type batchLine struct {
	index int
	data  []byte // the NDJSON line, newline included
	err   error  // it could not be encoded: answered here, never sent
	local int    // its line number in the request that sent it
}

// take returns the next line to send: one to send again, else the
// input's next; nil when both are exhausted.
func (b *batch) take(again *[]*batchLine) *batchLine {
	if len(*again) > 0 {
		l := (*again)[0]
		*again = (*again)[1:]
		return l
	}
	if b.srcDone {
		return nil
	}
	w, ok := b.next()
	if !ok {
		b.srcDone = true
		return nil
	}
	l := &batchLine{index: b.index}
	b.index++
	l.data, l.err = encodeLine(w)
	return l
}

// request sends one request: the lines to send again, then the input's,
// until the input ends or the writer stops answering. It returns how many
// lines were answered, and nil once every line of the input is answered.
// The lines it leaves unanswered are in b.resend, in input order.
func (b *batch) request() (answered int, err error) {
	pr, pw := io.Pipe()
	var (
		mu       sync.Mutex
		inFlight []*batchLine // taken from the input, not yet answered, in order
		untaken  []*batchLine // lines to send again the sender did not take
		failed   []*batchLine // answered store_unavailable: nothing of them was written
		complete bool         // the sender took the whole input and ends the body
	)
	again := b.resend
	b.resend = nil
	sent := make(chan struct{})
	go func() {
		defer close(sent)
		local := 0
		for {
			l := b.take(&again)
			if l == nil {
				mu.Lock()
				complete = true
				mu.Unlock()
				_ = pw.Close() // a pipe's Close never fails
				return
			}
			if l.err == nil {
				local++
				l.local = local
			}
			mu.Lock()
			inFlight = append(inFlight, l)
			mu.Unlock()
			if l.err != nil {
				continue
			}
			if _, err := pw.Write(l.data); err != nil {
				break // the request is over
			}
		}
		mu.Lock()
		untaken = again
		mu.Unlock()
	}()
	// end stops the sender and keeps what was not answered for the next
	// request, in input order.
	end := func(err error) (int, error) {
		_ = pr.CloseWithError(errBatchEnded) // a pipe's never fails
		<-sent
		mu.Lock()
		defer mu.Unlock()
		b.resend = append(append(append(b.resend, failed...), inFlight...), untaken...)
		if err == nil && len(b.resend) > 0 {
			err = &transportError{base: b.c.base, err: fmt.Errorf("the answer ended with %d lines unanswered: %w", len(b.resend), io.ErrUnexpectedEOF)}
		}
		return answered, err
	}

	req, err := http.NewRequestWithContext(b.ctx, http.MethodPost, b.c.base+"/v1/documents:batch", pr)
	if err != nil {
		return end(err)
	}
	req.Header.Set("Content-Type", "application/x-ndjson")
	b.c.authorize(req)
	resp, err := b.c.http.Do(req)
	if err != nil {
		return end(&transportError{base: b.c.base, err: err})
	}
	defer resp.Body.Close()
	if resp.StatusCode != http.StatusOK {
		return end(readError(resp))
	}
	// pop takes the oldest line in flight, answering on the way those
	// refused before they were sent; nil when none is left.
	pop := func() (*batchLine, error) {
		for {
			mu.Lock()
			if len(inFlight) == 0 {
				mu.Unlock()
				return nil, nil
			}
			l := inFlight[0]
			inFlight = inFlight[1:]
			mu.Unlock()
			if l.err == nil {
				return l, nil
			}
			b.stats.Lines++
			b.stats.Failed++
			if err := b.onResult(LineResult{Index: l.index, Err: l.err}); err != nil {
				return nil, err
			}
		}
	}
	rd := bufio.NewReaderSize(resp.Body, 64<<10) // a result line is far shorter
	for {
		line, err := readResult(rd)
		if err != nil {
			return end(&transportError{base: b.c.base, err: err})
		}
		if line == nil {
			break
		}
		var r wireResult
		if err := json.Unmarshal(line, &r); err != nil {
			return end(fmt.Errorf("client: a batch result line is not JSON: %w", err))
		}
		l, err := pop()
		if err != nil {
			return end(err)
		}
		if l == nil || l.local != r.Line {
			return end(fmt.Errorf("client: the writer answered line %d out of turn", r.Line))
		}
		if r.Error != nil && (r.Error.Code == CodeStoreUnavailable || r.Error.Code == CodeUnavailable) {
			mu.Lock()
			failed = append(failed, l)
			mu.Unlock()
			continue
		}
		answered++
		b.stats.Lines++
		res := LineResult{Index: l.index, Result: Result{Key: r.Key, Version: r.Version, Result: r.Result, EventID: r.EventID}}
		if r.Error != nil {
			res.Result.Result = ""
			res.Err = &Error{StatusCode: http.StatusOK, Code: r.Error.Code, Message: r.Error.Message, Line: r.Line}
			b.stats.Failed++
		} else {
			switch r.Result {
			case Applied:
				b.stats.Applied++
			case Unchanged:
				b.stats.Unchanged++
			case Stale:
				b.stats.Stale++
			}
		}
		if err := b.onResult(res); err != nil {
			return end(err)
		}
	}
	if len(failed) > 0 {
		return end(&Error{StatusCode: http.StatusOK, Code: CodeStoreUnavailable,
			Message: fmt.Sprintf("the writer's store failed; %d lines were not written", len(failed))})
	}
	// The answer is complete once the body was: the lines refused before
	// they were sent, after the last one answered, are answered here.
	mu.Lock()
	whole := complete
	mu.Unlock()
	if !whole {
		return end(nil) // the writer ended its answer before the body
	}
	l, err := pop()
	if err != nil {
		return end(err)
	}
	if l != nil {
		// A line sent and not answered: end sends it again.
		mu.Lock()
		inFlight = append([]*batchLine{l}, inFlight...)
		mu.Unlock()
	}
	return end(nil)
}

var errBatchEnded = errors.New("client: batch request ended")

// readResult reads the next result line of a batch's answer; nil at its
// end. A line without its newline is an answer cut off (the connection
// broke mid-line), not a line: an error, as a read that failed is.
func readResult(rd *bufio.Reader) ([]byte, error) {
	for {
		line, err := rd.ReadSlice('\n')
		switch {
		case errors.Is(err, bufio.ErrBufferFull):
			return nil, fmt.Errorf("a result line longer than %d bytes", rd.Size())
		case err != nil && len(line) > 0:
			return nil, fmt.Errorf("the answer ended in the middle of a line: %w", io.ErrUnexpectedEOF)
		case errors.Is(err, io.EOF):
			return nil, nil
		case err != nil:
			return nil, err
		}
		if len(bytes.TrimSpace(line)) > 0 {
			return line, nil
		}
	}
}

type wireResult struct {
	Line    int    `json:"line"`
	Key     string `json:"key"`
	Version int64  `json:"version"`
	Result  string `json:"result"`
	EventID string `json:"event_id"`
	Error   *struct {
		Code    string `json:"code"`
		Message string `json:"message"`
	} `json:"error"`
}

// wireLine is a document as the writer reads it: a batch line, or (Key
// empty) a PUT body.
type wireLine struct {
	Key       string          `json:"key,omitempty"`
	Version   int64           `json:"version"`
	Title     string          `json:"title,omitempty"`
	Body      string          `json:"body,omitempty"`
	Links     []string        `json:"links,omitempty"`
	Tags      []string        `json:"tags,omitempty"`
	Meta      json.RawMessage `json:"meta,omitempty"`
	Withdrawn bool            `json:"withdrawn,omitempty"`
}

func encodeLine(w Write) ([]byte, error) {
	l := wireLine{Key: w.Doc.Key, Version: w.Doc.Version, Withdrawn: w.Withdraw}
	if !w.Withdraw {
		l.Title, l.Body, l.Links, l.Tags, l.Meta = w.Doc.Title, w.Doc.Body, w.Doc.Links, w.Doc.Tags, w.Doc.Meta
	}
	data, err := json.Marshal(l)
	if err != nil {
		return nil, &Error{Code: CodeInvalidMeta, Message: fmt.Sprintf("document %q cannot be encoded: %v", w.Doc.Key, err)}
	}
	return append(data, '\n'), nil
}
