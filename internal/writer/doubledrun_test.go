package writer_test

// The doubled-run test: a fixed corpus is loaded through the real HTTP API,
// loaded again, and loaded a third time shuffled with every request sent
// three times. Idempotent ingestion means the second and third loads change
// nothing: same row counts, same table checksums, same contents, and exactly
// one outbox event per applied (key, version).

import (
	"bufio"
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"math"
	"math/rand/v2"
	"net/http"
	"net/url"
	"reflect"
	"slices"
	"sort"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"
	"unicode"
	"unicode/utf8"

	"github.com/google/uuid"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/converge-sync/converge/internal/chunking"
	"github.com/converge-sync/converge/internal/docstore"
	"github.com/converge-sync/converge/pkg/contract"
)

const (
	drCorpusSeed1 = 0x5eedd0b1ed
	drCorpusSeed2 = 20260818
	drCorpusKeys  = 1100
	// drMaxBatchLines lets NDJSON requests span several store transactions
	// (newEnv configures BatchSize 100), so results stream back while the
	// rest of the body is still being read.
	drMaxBatchLines = 250
)

// ---------------------------------------------------------------------------
// Corpus

// drOp is one write of the corpus: an upsert, or a withdrawal.
type drOp struct {
	Key      string
	Version  int64
	Withdraw bool
	Title    string
	Body     string
	Links    []string
	Tags     []string
	Meta     json.RawMessage
	// KeyInBody: a PUT also names the key in its body (it must match the path).
	KeyInBody bool
}

func (o *drOp) kind() contract.Kind {
	if o.Withdraw {
		return contract.KindWithdrawn
	}
	return contract.KindUpserted
}

func (o *drOp) String() string {
	if o.Withdraw {
		return fmt.Sprintf("withdraw %q@%d", o.Key, o.Version)
	}
	return fmt.Sprintf("upsert %q@%d", o.Key, o.Version)
}

type drCorpus struct {
	keys  []string           // generation order
	byKey map[string][]*drOp // each key's ops in version order
	ops   []*drOp            // all ops, key by key, in version order
	final map[string]*drOp   // the highest version of each key
	byVer map[drEvKey]*drOp
}

type drEvKey struct {
	Key     string
	Version int64
	Kind    string
}

func (c *drCorpus) upserts() (n int) {
	for _, o := range c.ops {
		if !o.Withdraw {
			n++
		}
	}
	return n
}

// drSpecialKeys need careful URL escaping: url.PathEscape keeps each one a
// single path segment. Pairs like "a/b" and "a%2Fb" collide if a client or
// the server escapes or unescapes once too often or too little.
// ("." and ".." are left out: as path segments they are dot-segments that
// any URL normaliser removes.)
var drSpecialKeys = []string{
	"a/b", "a%2Fb", "a%252Fb", "a b", "a%20b", "a+b", "a?b", "a%3Fb", "a#b",
	"docs/guide/intro.md", "docs//double//slashes", "/leading/slash", "trailing/slash/",
	"dots/../parent", "dots/./same", "x..y", "v1.2.3", "...", "file.tar.gz",
	"100% done", "%", "%%", "%zz", "%E2%82%AC", "?", "??", "what?", "q?x=1&y=2#frag",
	" leading space", "trailing space ", "  multiple   spaces  ",
	"ünïcødé", "日本語/文書/テスト", "emoji 🚀/launch", "ZWJ 👩‍💻 coder", "עברית/מסמך",
	"e\u0301 combining", "line\u2028separator", "bom\ufeffinside", "Ελληνικά.txt",
	"semi;colon,comma", "colon:at@dollar$", `back\slash`, `quote"s`, "apostrophe's",
	"<tag>&amp;", "~tilde*star(paren)[bracket]{brace}", "mixed/ü ?%.md",
	"max/version", "big/version",
	drLongKey(),
}

// drLongKey is exactly contract.MaxKeyBytes bytes, mostly two-byte runes.
func drLongKey() string {
	k := "long/" + strings.Repeat("ключ/", 100)
	for len(k) > contract.MaxKeyBytes {
		_, size := utf8.DecodeLastRuneInString(k)
		k = k[:len(k)-size]
	}
	return k + strings.Repeat("x", contract.MaxKeyBytes-len(k))
}

var (
	drWords = []string{
		"the", "writer", "stores", "every", "document", "version", "once", "and", "only", "once",
		"idempotent", "ingestion", "replay", "retry", "outbox", "chunk", "event", "freshness", "guard",
		"natural", "key", "upsert", "checksum", "table", "row", "load", "twice", "same", "result",
		"naïve", "façade", "Grüße", "東京", "данные", "λόγος", "🙂", "<script>", "&amp;", "50%",
		"a/b", "`code`", "**bold**", "_italic_", "über", "mañana", "数据库", "クエリ", "😀👍",
	}
	drSections = []string{"guide", "ref", "api", "howto", "faq", "blog", "notes", "spec"}
	drUniWords = []string{"données", "Straße", "日本語", "русский", "ελληνικά", "العربية", "emoji😀", "中文"}
	drTagVocab = []string{
		"go", "postgres", "idempotency", "идемпотентность", "日本", "release-notes", "how to",
		"a/b", "?", "100%", "draft", "🚀", "x.y.z", "Ünïcode", "<b>", "tag with spaces",
	}
)

func drPick[T any](rng *rand.Rand, xs []T) T { return xs[rng.IntN(len(xs))] }

func drSentence(rng *rand.Rand, minW, maxW int) string {
	n := minW + rng.IntN(maxW-minW+1)
	ws := make([]string, n)
	for i := range ws {
		ws[i] = drPick(rng, drWords)
	}
	r := []rune(strings.Join(ws, " "))
	r[0] = unicode.ToUpper(r[0])
	return string(r) + "."
}

func drParagraph(rng *rand.Rand) string {
	n := 1 + rng.IntN(5)
	ss := make([]string, n)
	for i := range ss {
		ss[i] = drSentence(rng, 4, 18)
	}
	return strings.Join(ss, " ")
}

func drGenBody(rng *rand.Rand) string {
	r := rng.IntN(100)
	var target int
	switch {
	case r < 8:
		return ""
	case r < 50:
		target = 20 + rng.IntN(800)
	case r < 85:
		target = 1000 + rng.IntN(2500)
	case r < 97:
		target = 4000 + rng.IntN(8000)
	case r < 99:
		// One long line without a blank: split by sentences and words.
		var b strings.Builder
		for b.Len() < 5000+rng.IntN(3000) {
			b.WriteString(drSentence(rng, 5, 25) + " ")
		}
		return b.String()
	default:
		// One enormous word of multi-byte runes: split by runes.
		return strings.Repeat(drPick(rng, drUniWords), 400+rng.IntN(400))
	}
	var blocks []string
	size := 0
	if rng.IntN(2) == 0 {
		blocks = append(blocks, "# "+drSentence(rng, 2, 6))
	}
	for size < target {
		var blk string
		switch rng.IntN(10) {
		case 0:
			blk = "## " + drSentence(rng, 2, 6)
		case 1:
			var items []string
			for range 3 + rng.IntN(6) {
				items = append(items, "- "+drSentence(rng, 3, 10))
			}
			blk = strings.Join(items, "\n")
		case 2:
			var lines []string
			for range 2 + rng.IntN(10) {
				lines = append(lines, "\tx := "+strconv.Quote(drSentence(rng, 1, 5)))
			}
			blk = "```go\n" + strings.Join(lines, "\n") + "\n```"
		case 3:
			blk = "> " + drParagraph(rng)
		default:
			blk = drParagraph(rng)
		}
		blocks = append(blocks, blk)
		size += len(blk) + 2
	}
	body := strings.Join(blocks, "\n\n") + "\n"
	if rng.IntN(20) == 0 {
		body = strings.ReplaceAll(body, "\n", "\r\n")
	}
	return body
}

func drGenTitle(rng *rand.Rand) string {
	if rng.IntN(10) == 0 {
		return ""
	}
	return strings.TrimSuffix(drSentence(rng, 1, 8), ".")
}

func drGenMeta(rng *rand.Rand) json.RawMessage {
	switch rng.IntN(10) {
	case 0:
		return nil
	case 1:
		return json.RawMessage(`{}`)
	case 2:
		// Not canonical: unsorted keys and white space.
		return json.RawMessage(fmt.Sprintf(`{ "z": %d, "a": {"y": [1, 2.5, "x"], "b": null}, "m": "<&> ü" }`, rng.IntN(100)))
	}
	m := map[string]any{"rev": rng.IntN(1000)}
	if rng.IntN(2) == 0 {
		m["author"] = drPick(rng, drWords)
	}
	if rng.IntN(2) == 0 {
		m["score"] = float64(rng.IntN(400)) / 4
	}
	if rng.IntN(3) == 0 {
		m["draft"] = rng.IntN(2) == 0
	}
	if rng.IntN(3) == 0 {
		m["labels"] = []any{drPick(rng, drTagVocab), drPick(rng, drWords), rng.IntN(10)}
	}
	if rng.IntN(4) == 0 {
		m["nested"] = map[string]any{"depth": 1, "ü": "ß", "inner": map[string]any{"k": nil}}
	}
	b, err := json.Marshal(m)
	if err != nil {
		panic(err)
	}
	return b
}

func drGenCorpus(n int) *drCorpus {
	rng := rand.New(rand.NewPCG(drCorpusSeed1, drCorpusSeed2))
	c := &drCorpus{byKey: map[string][]*drOp{}, final: map[string]*drOp{}, byVer: map[drEvKey]*drOp{}}
	seen := map[string]bool{}
	add := func(k string) {
		if !seen[k] {
			seen[k] = true
			c.keys = append(c.keys, k)
		}
	}
	for _, k := range drSpecialKeys {
		add(k)
	}
	for i := 0; len(c.keys) < n; i++ {
		w := drPick(rng, drWords)
		switch rng.IntN(8) {
		case 0:
			add(fmt.Sprintf("docs/%s/%s-%d.md", drPick(rng, drSections), w, i))
		case 1:
			add(fmt.Sprintf("notes/%s %s %d", w, drPick(rng, drWords), i))
		case 2:
			add(fmt.Sprintf("wiki/%s/%s_%d", drPick(rng, drUniWords), w, i))
		case 3:
			add(fmt.Sprintf("kb/%d/%s.%s.v%d", i, w, drPick(rng, drWords), rng.IntN(9)))
		case 4:
			add(fmt.Sprintf("search?q=%s&page=%d", w, i))
		case 5:
			add(fmt.Sprintf("pct/%d%%-%s", i, w))
		default:
			add(fmt.Sprintf("%s-%d", w, i))
		}
	}

	for _, k := range c.keys {
		// The sequence of kinds: 'u' upsert, 'w' withdrawal.
		ups := 1 + rng.IntN(4)
		var kinds string
		switch p := rng.IntN(100); {
		case p < 10: // ends withdrawn
			kinds = strings.Repeat("u", ups) + "w"
		case p < 13: // withdrawn, then upserted again
			ups = max(ups, 2)
			cut := 1 + rng.IntN(ups-1)
			kinds = strings.Repeat("u", cut) + "w" + strings.Repeat("u", ups-cut)
		case p < 14: // withdrawn without ever being upserted
			kinds = "w"
		default:
			kinds = strings.Repeat("u", ups)
		}
		var versions []int64
		v := int64(1 + rng.IntN(3))
		if rng.IntN(50) == 0 || k == "big/version" {
			v = 1<<53 + rng.Int64N(1000) // beyond float64 precision
		}
		for range kinds {
			versions = append(versions, v)
			if rng.IntN(10) == 0 {
				v += 100 + rng.Int64N(1000)
			} else {
				v += 1 + rng.Int64N(3)
			}
		}
		if k == "max/version" {
			kinds, versions = "uuw", []int64{5, math.MaxInt64 - 1, math.MaxInt64}
		}
		var prev *drOp
		for i, kc := range kinds {
			o := &drOp{Key: k, Version: versions[i], Withdraw: kc == 'w'}
			if !o.Withdraw {
				if prev != nil && rng.IntN(20) == 0 {
					// A new version with the same content.
					o.Title, o.Body, o.Links, o.Tags, o.Meta = prev.Title, prev.Body, prev.Links, prev.Tags, prev.Meta
				} else {
					o.Title, o.Body, o.Meta = drGenTitle(rng), drGenBody(rng), drGenMeta(rng)
					for range rng.IntN(6) {
						o.Links = append(o.Links, drPick(rng, c.keys))
					}
					if rng.IntN(10) == 0 {
						o.Links = append(o.Links, k, k) // self-link, duplicated
					}
					for range rng.IntN(6) {
						o.Tags = append(o.Tags, drPick(rng, drTagVocab))
					}
				}
				o.KeyInBody = rng.IntN(3) == 0
				prev = o
			}
			c.byKey[k] = append(c.byKey[k], o)
			c.ops = append(c.ops, o)
			c.byVer[drEvKey{o.Key, o.Version, string(o.kind())}] = o
		}
		c.final[k] = c.byKey[k][len(c.byKey[k])-1]
	}
	return c
}

// ---------------------------------------------------------------------------
// Client

type drErrorBody struct {
	Code    string `json:"code"`
	Message string `json:"message"`
}

type drResult struct {
	Line    int          `json:"line"`
	Key     string       `json:"key"`
	Version int64        `json:"version"`
	Result  string       `json:"result"`
	EventID *uuid.UUID   `json:"event_id"`
	Error   *drErrorBody `json:"error"`
}

type drWireDoc struct {
	Key       *string         `json:"key,omitempty"`
	Version   int64           `json:"version"`
	Title     string          `json:"title,omitempty"`
	Body      string          `json:"body,omitempty"`
	Links     []string        `json:"links,omitempty"`
	Tags      []string        `json:"tags,omitempty"`
	Meta      json.RawMessage `json:"meta,omitempty"`
	Withdrawn bool            `json:"withdrawn,omitempty"`
}

type drRecord struct {
	op  *drOp
	res drResult
	via string // "single" or "batch"
}

type drLoader struct {
	base     string
	hc       *http.Client
	requests atomic.Int64

	mu   sync.Mutex
	recs []drRecord
	errs []error
}

func drNewLoader(t *testing.T, base string) *drLoader {
	tr := &http.Transport{MaxIdleConns: 64, MaxIdleConnsPerHost: 64, IdleConnTimeout: 30 * time.Second}
	t.Cleanup(tr.CloseIdleConnections)
	return &drLoader{base: base, hc: &http.Client{Transport: tr, Timeout: 2 * time.Minute}}
}

func drDocURL(base, key string) string { return base + "/v1/documents/" + url.PathEscape(key) }

func (l *drLoader) addRecords(rs ...drRecord) {
	l.mu.Lock()
	l.recs = append(l.recs, rs...)
	l.mu.Unlock()
}

func (l *drLoader) fail(err error) {
	l.mu.Lock()
	l.errs = append(l.errs, err)
	l.mu.Unlock()
}

// take returns and resets what was recorded.
func (l *drLoader) take() ([]drRecord, []error) {
	l.mu.Lock()
	defer l.mu.Unlock()
	r, e := l.recs, l.errs
	l.recs, l.errs = nil, nil
	return r, e
}

func (l *drLoader) do(req *http.Request) (int, []byte, error) {
	l.requests.Add(1)
	resp, err := l.hc.Do(req)
	if err != nil {
		return 0, nil, err
	}
	defer resp.Body.Close()
	data, err := io.ReadAll(resp.Body)
	return resp.StatusCode, data, err
}

// single sends o as PUT or DELETE.
func (l *drLoader) single(ctx context.Context, o *drOp) error {
	var (
		req *http.Request
		err error
	)
	if o.Withdraw {
		req, err = http.NewRequestWithContext(ctx, http.MethodDelete,
			drDocURL(l.base, o.Key)+"?version="+strconv.FormatInt(o.Version, 10), nil)
	} else {
		w := drWireDoc{Version: o.Version, Title: o.Title, Body: o.Body, Links: o.Links, Tags: o.Tags, Meta: o.Meta}
		if o.KeyInBody {
			w.Key = &o.Key
		}
		body, merr := json.Marshal(w)
		if merr != nil {
			return merr
		}
		req, err = http.NewRequestWithContext(ctx, http.MethodPut, drDocURL(l.base, o.Key), bytes.NewReader(body))
		if req != nil {
			req.Header.Set("Content-Type", "application/json")
		}
	}
	if err != nil {
		return err
	}
	status, data, err := l.do(req)
	if err != nil {
		return fmt.Errorf("%s: %w", o, err)
	}
	if status != http.StatusOK {
		return fmt.Errorf("%s: %s %s: status %d: %.300s", o, req.Method, req.URL.EscapedPath(), status, data)
	}
	var r drResult
	if err := json.Unmarshal(data, &r); err != nil {
		return fmt.Errorf("%s: decoding %.300s: %w", o, data, err)
	}
	if r.Key != o.Key || r.Version != o.Version {
		return fmt.Errorf("%s: answered for %q@%d", o, r.Key, r.Version)
	}
	l.addRecords(drRecord{op: o, res: r, via: "single"})
	return nil
}

// batch sends ops as one NDJSON request and checks that every line is
// answered exactly once.
func (l *drLoader) batch(ctx context.Context, ops []*drOp) error {
	var buf bytes.Buffer
	for _, o := range ops {
		w := drWireDoc{Key: &o.Key, Version: o.Version, Withdrawn: o.Withdraw}
		if !o.Withdraw {
			w.Title, w.Body, w.Links, w.Tags, w.Meta = o.Title, o.Body, o.Links, o.Tags, o.Meta
		}
		line, err := json.Marshal(w)
		if err != nil {
			return err
		}
		buf.Write(line)
		buf.WriteByte('\n')
	}
	req, err := http.NewRequestWithContext(ctx, http.MethodPost, l.base+"/v1/documents:batch", &buf)
	if err != nil {
		return err
	}
	req.Header.Set("Content-Type", "application/x-ndjson")
	status, data, err := l.do(req)
	if err != nil {
		return fmt.Errorf("batch of %d: %w", len(ops), err)
	}
	if status != http.StatusOK {
		return fmt.Errorf("batch of %d: status %d: %.300s", len(ops), status, data)
	}
	got := make([]*drResult, len(ops))
	sc := bufio.NewScanner(bytes.NewReader(data))
	sc.Buffer(nil, 1<<20)
	for sc.Scan() {
		var r drResult
		if err := json.Unmarshal(sc.Bytes(), &r); err != nil {
			return fmt.Errorf("batch of %d: result line %.300q: %w", len(ops), sc.Text(), err)
		}
		if r.Line < 1 || r.Line > len(ops) || got[r.Line-1] != nil {
			return fmt.Errorf("batch of %d: unexpected or repeated result line %.300q", len(ops), sc.Text())
		}
		got[r.Line-1] = &r
	}
	if err := sc.Err(); err != nil {
		return err
	}
	recs := make([]drRecord, 0, len(ops))
	var missing []int
	for i, r := range got {
		switch {
		case r == nil:
			missing = append(missing, i+1)
		case r.Key != ops[i].Key || r.Version != ops[i].Version:
			return fmt.Errorf("batch line %d (%s) answered for %q@%d", i+1, ops[i], r.Key, r.Version)
		default:
			recs = append(recs, drRecord{op: ops[i], res: *r, via: "batch"})
		}
	}
	l.addRecords(recs...)
	if len(missing) > 0 {
		return fmt.Errorf("batch of %d lines: %d lines not answered (first: line %d, %s)",
			len(ops), len(missing), missing[0], ops[missing[0]-1])
	}
	return nil
}

// drUnit is one piece of work for a worker: an NDJSON request, or PUT/DELETE
// requests one after another. With copies > 1 the unit is sent that many
// times at once, to race identical writes against each other.
type drUnit struct {
	batch  []*drOp
	seq    []*drOp
	copies int
}

func (l *drLoader) runUnit(ctx context.Context, u drUnit) {
	start := make(chan struct{})
	var wg sync.WaitGroup
	for range max(u.copies, 1) {
		wg.Go(func() {
			<-start
			if u.batch != nil {
				if err := l.batch(ctx, u.batch); err != nil {
					l.fail(err)
				}
				return
			}
			for _, o := range u.seq {
				if err := l.single(ctx, o); err != nil {
					l.fail(err)
					return // later versions of the key would be out of order
				}
			}
		})
	}
	close(start)
	wg.Wait()
}

// load runs units on workers and returns what was answered.
func (l *drLoader) load(ctx context.Context, workers int, units []drUnit) ([]drRecord, []error) {
	ch := make(chan drUnit)
	var wg sync.WaitGroup
	for range workers {
		wg.Go(func() {
			for u := range ch {
				l.runUnit(ctx, u)
			}
		})
	}
	for _, u := range units {
		ch <- u
	}
	close(ch)
	wg.Wait()
	return l.take()
}

// ---------------------------------------------------------------------------
// Plans

// drInterleave merges queues at random, keeping each queue's order.
func drInterleave(rng *rand.Rand, queues [][]*drOp) []*drOp {
	var out []*drOp
	queues = slices.Clone(queues)
	for len(queues) > 0 {
		i := rng.IntN(len(queues))
		out = append(out, queues[i][0])
		if queues[i] = queues[i][1:]; len(queues[i]) == 0 {
			queues = slices.Delete(queues, i, i+1)
		}
	}
	return out
}

// drPlanInOrder partitions the keys: about 70% go into NDJSON batches (each
// key wholly in one batch, its versions in order, interleaved with other
// keys), the rest are sent as PUT/DELETE, one key after another's versions
// in order. Every key is in exactly one unit, so concurrent workers cannot
// reorder a key's versions.
func drPlanInOrder(c *drCorpus, rng *rand.Rand) []drUnit {
	keys := slices.Clone(c.keys)
	rng.Shuffle(len(keys), func(i, j int) { keys[i], keys[j] = keys[j], keys[i] })
	nBatch := len(keys) * 7 / 10
	var units []drUnit
	for i := 0; i < nBatch; {
		target := 30 + rng.IntN(drMaxBatchLines-30+1)
		var group [][]*drOp
		lines := 0
		for i < nBatch && lines+len(c.byKey[keys[i]]) <= target {
			group = append(group, c.byKey[keys[i]])
			lines += len(c.byKey[keys[i]])
			i++
		}
		units = append(units, drUnit{batch: drInterleave(rng, group), copies: 1})
	}
	for _, k := range keys[nBatch:] {
		units = append(units, drUnit{seq: c.byKey[k], copies: 1})
	}
	rng.Shuffle(len(units), func(i, j int) { units[i], units[j] = units[j], units[i] })
	return units
}

func drChunkOps(rng *rand.Rand, ops []*drOp, minN, maxN, copies int) []drUnit {
	var units []drUnit
	for len(ops) > 0 {
		n := min(len(ops), minN+rng.IntN(maxN-minN+1))
		units = append(units, drUnit{batch: ops[:n:n], copies: copies})
		ops = ops[n:]
	}
	return units
}

// drPlanShuffled sends every op copies times in random order, older versions
// possibly after newer ones. With copies > 1: some ops' copies are sent
// concurrently as PUT/DELETE, some in identical NDJSON batches sent
// concurrently, the rest each copy on its own, as PUT/DELETE or a line of
// some batch (possibly the same batch as another copy).
func drPlanShuffled(c *drCorpus, rng *rand.Rand, copies int) []drUnit {
	ops := slices.Clone(c.ops)
	rng.Shuffle(len(ops), func(i, j int) { ops[i], ops[j] = ops[j], ops[i] })
	var units []drUnit
	var batchPool, racePool []*drOp
	for _, o := range ops {
		r := rng.IntN(10)
		switch {
		case copies > 1 && r < 3:
			units = append(units, drUnit{seq: []*drOp{o}, copies: copies})
		case copies > 1 && r < 5:
			racePool = append(racePool, o)
		default:
			for range copies {
				if rng.IntN(10) < 6 {
					batchPool = append(batchPool, o)
				} else {
					units = append(units, drUnit{seq: []*drOp{o}, copies: 1})
				}
			}
		}
	}
	rng.Shuffle(len(batchPool), func(i, j int) { batchPool[i], batchPool[j] = batchPool[j], batchPool[i] })
	units = append(units, drChunkOps(rng, batchPool, 20, drMaxBatchLines, 1)...)
	units = append(units, drChunkOps(rng, racePool, 10, 50, copies)...)
	rng.Shuffle(len(units), func(i, j int) { units[i], units[j] = units[j], units[i] })
	return units
}

// ---------------------------------------------------------------------------
// Checks

// drLimiter reports the first few of many similar errors.
type drLimiter struct {
	t     *testing.T
	label string
	n     int
}

func (l *drLimiter) errorf(format string, args ...any) {
	l.t.Helper()
	if l.n++; l.n <= 15 {
		l.t.Errorf(l.label+": "+format, args...)
	}
}

func (l *drLimiter) done() {
	l.t.Helper()
	if l.n > 15 {
		l.t.Errorf("%s: ... %d errors in all", l.label, l.n)
	}
}

func drFatalErrs(t *testing.T, label string, errs []error) {
	t.Helper()
	if len(errs) == 0 {
		return
	}
	for i, err := range errs {
		if i == 15 {
			break
		}
		t.Errorf("%s: %v", label, err)
	}
	t.Fatalf("%s: %d requests failed", label, len(errs))
}

// drCheckResults compares every answer with expect(op) and the event id with
// the contract's, and returns the results by kind.
func drCheckResults(t *testing.T, label string, recs []drRecord, expect func(*drOp) string) map[string]int {
	t.Helper()
	lim := &drLimiter{t: t, label: label}
	counts := map[string]int{}
	for _, r := range recs {
		counts[r.via]++
		if r.res.Error != nil {
			counts["error"]++
			lim.errorf("%s via %s: error %s: %s", r.op, r.via, r.res.Error.Code, r.res.Error.Message)
			continue
		}
		counts[r.res.Result]++
		if want := expect(r.op); want != "" && r.res.Result != want {
			lim.errorf("%s via %s: result %q, want %q", r.op, r.via, r.res.Result, want)
		}
		if want := contract.EventID(r.op.Key, r.op.Version, r.op.kind()); r.res.EventID == nil || *r.res.EventID != want {
			lim.errorf("%s via %s: event_id %v, want %s", r.op, r.via, r.res.EventID, want)
		}
	}
	lim.done()
	return counts
}

// drTables are checksummed over their rows in primary-key order, without the
// timestamps (updated_at, created_at), which are checked apart.
var drTables = []struct{ name, sel, pk string }{
	{"documents", "SELECT key, version, deleted, title, links, tags, meta, content_hash, chunk_count FROM documents", "key"},
	{"chunks", "SELECT id, key, version, ordinal, text, content_hash FROM chunks", "id"},
	{"outbox", "SELECT event_id, key, version, kind, payload FROM outbox", "event_id"},
}

type drTableState struct {
	Count int64
	Sum   string
	Rows  map[string]string // primary key -> row
}

type drDbState struct {
	Tables map[string]drTableState
	// Stamps is a checksum of the timestamps: a row rewritten with the same
	// content changes it.
	Stamps string
}

func drSnapshot(t *testing.T, ctx context.Context, pool *pgxpool.Pool) drDbState {
	t.Helper()
	st := drDbState{Tables: map[string]drTableState{}}
	for _, tb := range drTables {
		var ts drTableState
		q := fmt.Sprintf("SELECT count(*), coalesce(md5(string_agg(t::text, '|' ORDER BY t.%s)), '') FROM (%s) t", tb.pk, tb.sel)
		if err := pool.QueryRow(ctx, q).Scan(&ts.Count, &ts.Sum); err != nil {
			t.Fatalf("checksum %s: %v", tb.name, err)
		}
		rows, err := pool.Query(ctx, fmt.Sprintf("SELECT t.%s::text, t::text FROM (%s) t", tb.pk, tb.sel))
		if err != nil {
			t.Fatalf("rows of %s: %v", tb.name, err)
		}
		defer rows.Close() // on t.Fatal; it is closed at the end of the loop anyway
		ts.Rows = map[string]string{}
		var pk, row string
		for rows.Next() {
			if err := rows.Scan(&pk, &row); err != nil {
				t.Fatalf("rows of %s: %v", tb.name, err)
			}
			ts.Rows[pk] = row
		}
		if err := rows.Err(); err != nil {
			t.Fatalf("rows of %s: %v", tb.name, err)
		}
		if int64(len(ts.Rows)) != ts.Count {
			t.Fatalf("%s: count(*) %d but %d distinct primary keys read", tb.name, ts.Count, len(ts.Rows))
		}
		st.Tables[tb.name] = ts
	}
	const stampsSQL = `SELECT
	    coalesce((SELECT md5(string_agg(key || ' ' || updated_at::text, '|' ORDER BY key)) FROM documents), '') || ':' ||
	    coalesce((SELECT md5(string_agg(event_id::text || ' ' || created_at::text, '|' ORDER BY event_id)) FROM outbox), '')`
	if err := pool.QueryRow(ctx, stampsSQL).Scan(&st.Stamps); err != nil {
		t.Fatalf("timestamps: %v", err)
	}
	return st
}

// drCompareStates reports every difference of got from want in the named
// drTables: count, checksum and rows.
func drCompareStates(t *testing.T, label string, want, got drDbState, names ...string) {
	t.Helper()
	for _, name := range names {
		w, g := want.Tables[name], got.Tables[name]
		if w.Count != g.Count {
			t.Errorf("%s: %s has %d rows, want %d", label, name, g.Count, w.Count)
		}
		if w.Sum != g.Sum {
			t.Errorf("%s: %s checksum %s, want %s", label, name, g.Sum, w.Sum)
		}
		lim := &drLimiter{t: t, label: label + ": " + name}
		for _, pk := range drSortedKeys(w.Rows) {
			switch gr, ok := g.Rows[pk]; {
			case !ok:
				lim.errorf("row %s is missing; was %.300s", pk, w.Rows[pk])
			case gr != w.Rows[pk]:
				lim.errorf("row %s changed:\n got  %.300s\n want %.300s", pk, gr, w.Rows[pk])
			}
		}
		for _, pk := range drSortedKeys(g.Rows) {
			if _, ok := w.Rows[pk]; !ok {
				lim.errorf("extra row %s: %.300s", pk, g.Rows[pk])
			}
		}
		lim.done()
	}
}

func drSortedKeys[V any](m map[string]V) []string {
	ks := make([]string, 0, len(m))
	for k := range m {
		ks = append(ks, k)
	}
	sort.Strings(ks)
	return ks
}

// drCheckOutboxExact compares the outbox's (key, version, kind) with want:
// the same set, and no (key, version, kind) twice.
func drCheckOutboxExact(t *testing.T, ctx context.Context, label string, pool *pgxpool.Pool, want map[drEvKey]bool) {
	t.Helper()
	rows, err := pool.Query(ctx, `SELECT key, version, kind FROM outbox`)
	if err != nil {
		t.Fatalf("%s: outbox: %v", label, err)
	}
	defer rows.Close()
	got := map[drEvKey]int{}
	var e drEvKey
	for rows.Next() {
		if err := rows.Scan(&e.Key, &e.Version, &e.Kind); err != nil {
			t.Fatalf("%s: outbox: %v", label, err)
		}
		got[e]++
	}
	if err := rows.Err(); err != nil {
		t.Fatalf("%s: outbox: %v", label, err)
	}
	lim := &drLimiter{t: t, label: label + ": outbox"}
	for e, n := range got {
		switch {
		case !want[e]:
			lim.errorf("unexpected event %q@%d %s (%d rows)", e.Key, e.Version, e.Kind, n)
		case n != 1:
			lim.errorf("event %q@%d %s is there %d times, want once", e.Key, e.Version, e.Kind, n)
		}
	}
	for e := range want {
		if got[e] == 0 {
			lim.errorf("missing event %q@%d %s", e.Key, e.Version, e.Kind)
		}
	}
	lim.done()
}

func drSortedSet(in []string) []string {
	out := slices.Clone(in)
	slices.Sort(out)
	out = slices.Compact(out)
	if out == nil {
		out = []string{}
	}
	return out
}

func drMetaEqual(a, b json.RawMessage) bool {
	dec := func(m json.RawMessage) (any, bool) {
		if len(bytes.TrimSpace(m)) == 0 {
			m = json.RawMessage(`{}`)
		}
		var v any
		return v, json.Unmarshal(m, &v) == nil
	}
	va, oka := dec(a)
	vb, okb := dec(b)
	return oka && okb && reflect.DeepEqual(va, vb)
}

// drCheckOutboxEvents decodes every outbox payload: it must be a valid event
// whose id, key, version and kind are the row's, describing the corpus'
// drOp of that version.
func drCheckOutboxEvents(t *testing.T, ctx context.Context, label string, pool *pgxpool.Pool, c *drCorpus) {
	t.Helper()
	rows, err := pool.Query(ctx, `SELECT event_id::text, key, version, kind, payload::text FROM outbox`)
	if err != nil {
		t.Fatalf("%s: outbox: %v", label, err)
	}
	defer rows.Close()
	lim := &drLimiter{t: t, label: label + ": outbox payload"}
	var (
		id, key, kind, payload string
		version                int64
	)
	for rows.Next() {
		if err := rows.Scan(&id, &key, &version, &kind, &payload); err != nil {
			t.Fatalf("%s: outbox: %v", label, err)
		}
		ev, err := contract.DecodeEvent([]byte(payload))
		if err != nil {
			lim.errorf("event %s (%q@%d): %v", id, key, version, err)
			continue
		}
		if ev.ID.String() != id || ev.Key != key || ev.Version != version || string(ev.Kind) != kind {
			lim.errorf("row (%s, %q, %d, %s) carries event (%s, %q, %d, %s)", id, key, version, kind, ev.ID, ev.Key, ev.Version, ev.Kind)
			continue
		}
		o := c.byVer[drEvKey{key, version, kind}]
		if o == nil {
			lim.errorf("event %q@%d %s is of no op of the corpus", key, version, kind)
			continue
		}
		if !o.Withdraw && (ev.Title != o.Title || ev.Body() != o.Body || !slices.Equal(ev.Links, drSortedSet(o.Links)) ||
			!slices.Equal(ev.Tags, drSortedSet(o.Tags)) || !drMetaEqual(ev.Meta, o.Meta)) {
			lim.errorf("event of %s does not carry its content", o)
		}
	}
	if err := rows.Err(); err != nil {
		t.Fatalf("%s: outbox: %v", label, err)
	}
	lim.done()
}

// drCheckAgainstCorpus compares the documents and chunks with the final op
// of every key of the corpus.
func drCheckAgainstCorpus(t *testing.T, ctx context.Context, label string, pool *pgxpool.Pool, c *drCorpus) {
	t.Helper()
	lim := &drLimiter{t: t, label: label + ": contents"}
	rows, err := pool.Query(ctx, `
SELECT d.key, d.version, d.deleted, d.title, d.links, d.tags, d.meta::text, d.content_hash, d.chunk_count,
       (SELECT count(*) FROM chunks c WHERE c.key = d.key),
       coalesce((SELECT string_agg(c.text, '' ORDER BY c.ordinal) FROM chunks c WHERE c.key = d.key), '')
FROM documents d`)
	if err != nil {
		t.Fatalf("%s: documents: %v", label, err)
	}
	defer rows.Close()
	found := map[string]bool{}
	for rows.Next() {
		var (
			key, title, meta, hash, body string
			version                      int64
			deleted                      bool
			links, tags                  []string
			chunkCount                   int
			chunkRows                    int64
		)
		if err := rows.Scan(&key, &version, &deleted, &title, &links, &tags, &meta, &hash, &chunkCount, &chunkRows, &body); err != nil {
			t.Fatalf("%s: documents: %v", label, err)
		}
		found[key] = true
		o := c.final[key]
		if o == nil {
			lim.errorf("document %q is not in the corpus", key)
			continue
		}
		if version != o.Version || deleted != o.Withdraw {
			lim.errorf("%q stored at version %d (deleted %v), want the final %s", key, version, deleted, o)
			continue
		}
		if int64(chunkCount) != chunkRows {
			lim.errorf("%q: chunk_count %d but %d chunk rows", key, chunkCount, chunkRows)
		}
		if o.Withdraw {
			if title != "" || len(links) > 0 || len(tags) > 0 || meta != "{}" || body != "" || hash != contract.WithdrawnHash(key) {
				lim.errorf("%q: tombstone has content: title %q links %v tags %v meta %s body %d bytes hash %s",
					key, title, links, tags, meta, len(body), hash)
			}
			continue
		}
		norm, err := contract.Document{Key: o.Key, Version: o.Version, Title: o.Title, Body: o.Body, Links: o.Links, Tags: o.Tags, Meta: o.Meta}.Normalize()
		if err != nil {
			t.Fatalf("corpus %s is invalid: %v", o, err)
		}
		switch {
		case title != o.Title:
			lim.errorf("%q: title %q, want %q", key, title, o.Title)
		case body != o.Body:
			lim.errorf("%q: body of %d bytes differs from the %d bytes written", key, len(body), len(o.Body))
		case !slices.Equal(links, norm.Links) || !slices.Equal(tags, norm.Tags):
			lim.errorf("%q: links %q tags %q, want %q %q", key, links, tags, norm.Links, norm.Tags)
		case !drMetaEqual(json.RawMessage(meta), o.Meta):
			lim.errorf("%q: meta %s, want %s", key, meta, o.Meta)
		case hash != contract.ContentHash(norm):
			lim.errorf("%q: content_hash %s, want %s", key, hash, contract.ContentHash(norm))
		case chunkCount != len(chunking.Split(o.Body, chunking.DefaultConfig())):
			lim.errorf("%q: %d chunks, want %d", key, chunkCount, len(chunking.Split(o.Body, chunking.DefaultConfig())))
		}
	}
	if err := rows.Err(); err != nil {
		t.Fatalf("%s: documents: %v", label, err)
	}
	for _, k := range c.keys {
		if !found[k] {
			lim.errorf("document %q is missing", k)
		}
	}

	// Every chunk belongs to its document's current version, under its
	// derived id, with ordinals 0..n-1.
	crows, err := pool.Query(ctx, `SELECT c.id::text, c.key, c.version, c.ordinal, c.content_hash, c.text, d.version, d.deleted
FROM chunks c JOIN documents d USING (key) ORDER BY c.key, c.ordinal`)
	if err != nil {
		t.Fatalf("%s: chunks: %v", label, err)
	}
	defer crows.Close()
	next := map[string]int{}
	for crows.Next() {
		var (
			id, key, hash, text string
			version, docVersion int64
			ordinal             int
			deleted             bool
		)
		if err := crows.Scan(&id, &key, &version, &ordinal, &hash, &text, &docVersion, &deleted); err != nil {
			t.Fatalf("%s: chunks: %v", label, err)
		}
		switch {
		case version != docVersion || deleted:
			lim.errorf("chunk %s of %q is of version %d, the document is at %d (deleted %v)", id, key, version, docVersion, deleted)
		case ordinal != next[key]:
			lim.errorf("chunk %s of %q has ordinal %d, want %d", id, key, ordinal, next[key])
		case id != contract.ChunkID(key, version, ordinal).String():
			lim.errorf("chunk %q@%d#%d has id %s, want %s", key, version, ordinal, id, contract.ChunkID(key, version, ordinal))
		case hash != contract.TextHash(text):
			lim.errorf("chunk %s of %q: content_hash does not match its text", id, key)
		}
		next[key] = ordinal + 1
	}
	if err := crows.Err(); err != nil {
		t.Fatalf("%s: chunks: %v", label, err)
	}
	lim.done()
}

// drCheckGet reads keys back through GET /v1/documents/{key}.
func drCheckGet(t *testing.T, ctx context.Context, l *drLoader, c *drCorpus, keys []string) {
	t.Helper()
	lim := &drLimiter{t: t, label: "GET round trip"}
	get := func(key string) (int, []byte) {
		req, err := http.NewRequestWithContext(ctx, http.MethodGet, drDocURL(l.base, key), nil)
		if err != nil {
			t.Fatal(err)
		}
		status, data, err := l.do(req)
		if err != nil {
			t.Fatalf("GET %q: %v", key, err)
		}
		return status, data
	}
	for _, key := range keys {
		status, data := get(key)
		if status != http.StatusOK {
			lim.errorf("GET %q: status %d: %.300s", key, status, data)
			continue
		}
		var rec docstore.Record
		if err := json.Unmarshal(data, &rec); err != nil {
			lim.errorf("GET %q: %v", key, err)
			continue
		}
		o := c.final[key]
		switch {
		case rec.Key != key:
			lim.errorf("GET %q answered key %q", key, rec.Key)
		case rec.Version != o.Version || rec.Withdrawn != o.Withdraw:
			lim.errorf("GET %q: version %d withdrawn %v, want %s", key, rec.Version, rec.Withdrawn, o)
		case !o.Withdraw && (rec.Title != o.Title || rec.Body != o.Body || !slices.Equal(rec.Links, drSortedSet(o.Links)) ||
			!slices.Equal(rec.Tags, drSortedSet(o.Tags)) || !drMetaEqual(rec.Meta, o.Meta)):
			lim.errorf("GET %q: content differs from %s", key, o)
		case o.Withdraw && (rec.Body != "" || rec.Chunks != 0):
			lim.errorf("GET %q: tombstone with a body", key)
		}
	}
	// A key that was never written, next to ones that were.
	for _, key := range []string{"a/b/", "a%2Fb ", "never written ?%/x"} {
		if status, data := get(key); status != http.StatusNotFound {
			lim.errorf("GET %q (never written): status %d, want 404: %.200s", key, status, data)
		}
	}
	lim.done()
}

func drTableCounts(st drDbState) string {
	return fmt.Sprintf("documents=%d chunks=%d outbox=%d",
		st.Tables["documents"].Count, st.Tables["chunks"].Count, st.Tables["outbox"].Count)
}

// drLoadInOrder sends the corpus in version order per key and checks that
// every write applied.
func drLoadInOrder(t *testing.T, ctx context.Context, label string, l *drLoader, c *drCorpus, units []drUnit, expect func(*drOp) string) {
	t.Helper()
	before := l.requests.Load()
	start := time.Now()
	recs, errs := l.load(ctx, 4, units)
	drFatalErrs(t, label, errs)
	if len(recs) != len(c.ops) {
		t.Fatalf("%s: %d answers, want one per op (%d)", label, len(recs), len(c.ops))
	}
	counts := drCheckResults(t, label, recs, expect)
	t.Logf("%s: %d ops in %d requests (%d via batch, %d via PUT/DELETE) in %v: %d applied, %d unchanged, %d stale, %d errors",
		label, len(recs), l.requests.Load()-before, counts["batch"], counts["single"], time.Since(start).Round(time.Millisecond),
		counts["applied"], counts["unchanged"], counts["stale"], counts["error"])
}

// ---------------------------------------------------------------------------
// Tests

func TestDoubledRun(t *testing.T) {
	t.Parallel()
	ctx, cancel := context.WithTimeout(t.Context(), 3*time.Minute)
	defer cancel()
	c := drGenCorpus(drCorpusKeys)
	if len(c.keys) < 1000 {
		t.Fatalf("corpus has %d keys, want at least 1000", len(c.keys))
	}
	withdrawnAtEnd := 0
	for _, k := range c.keys {
		if c.final[k].Withdraw {
			withdrawnAtEnd++
		}
	}
	t.Logf("corpus: %d keys, %d ops (%d upserts, %d withdrawals), %d keys end withdrawn",
		len(c.keys), len(c.ops), c.upserts(), len(c.ops)-c.upserts(), withdrawnAtEnd)

	env := newEnv(t)
	l := drNewLoader(t, env.srv.URL)
	rng := rand.New(rand.NewPCG(drCorpusSeed1+1, drCorpusSeed2))
	plan := drPlanInOrder(c, rng)

	// In order, every op applies: one event per op of the corpus.
	wantOutbox := map[drEvKey]bool{}
	for _, o := range c.ops {
		wantOutbox[drEvKey{o.Key, o.Version, string(o.kind())}] = true
	}
	// After the first load, a key's final op is unchanged and the others stale.
	replay := func(o *drOp) string {
		if c.final[o.Key] == o {
			return "unchanged"
		}
		return "stale"
	}

	// Load 1.
	drLoadInOrder(t, ctx, "load 1", l, c, plan, func(*drOp) string { return "applied" })
	first := drSnapshot(t, ctx, env.pool)
	t.Logf("after load 1: %s", drTableCounts(first))
	if got := first.Tables["documents"].Count; got != int64(len(c.keys)) {
		t.Errorf("load 1: %d documents, want one per key (%d)", got, len(c.keys))
	}
	drCheckAgainstCorpus(t, ctx, "load 1", env.pool, c)
	drCheckOutboxExact(t, ctx, "load 1", env.pool, wantOutbox)
	drCheckOutboxEvents(t, ctx, "load 1", env.pool, c)
	getKeys := slices.Clone(drSpecialKeys)
	for range 10 {
		getKeys = append(getKeys, drPick(rng, c.keys))
	}
	drCheckGet(t, ctx, l, c, getKeys)
	if t.Failed() {
		t.FailNow()
	}

	// Load 2: the same load again.
	drLoadInOrder(t, ctx, "load 2", l, c, plan, replay)
	second := drSnapshot(t, ctx, env.pool)
	t.Logf("after load 2: %s", drTableCounts(second))
	drCompareStates(t, "load 2", first, second, "documents", "chunks", "outbox")
	if second.Stamps != first.Stamps {
		t.Errorf("load 2 rewrote rows: the timestamps of documents or outbox changed")
	}
	drCheckOutboxExact(t, ctx, "load 2", env.pool, wantOutbox)

	// Load 3: shuffled, every op three times, some copies concurrently.
	units := drPlanShuffled(c, rng, 3)
	before := l.requests.Load()
	start := time.Now()
	recs, errs := l.load(ctx, 8, units)
	drFatalErrs(t, "load 3", errs)
	sent := map[*drOp]int{}
	for _, r := range recs {
		sent[r.op]++
	}
	for _, o := range c.ops {
		if sent[o] != 3 {
			t.Errorf("load 3: %s answered %d times, want 3", o, sent[o])
		}
	}
	counts := drCheckResults(t, "load 3", recs, replay)
	t.Logf("load 3: %d sends of %d ops in %d requests (%d via batch, %d via PUT/DELETE) in %v: %d applied, %d unchanged, %d stale, %d errors",
		len(recs), len(c.ops), l.requests.Load()-before, counts["batch"], counts["single"], time.Since(start).Round(time.Millisecond),
		counts["applied"], counts["unchanged"], counts["stale"], counts["error"])
	third := drSnapshot(t, ctx, env.pool)
	t.Logf("after load 3: %s", drTableCounts(third))
	drCompareStates(t, "load 3", first, third, "documents", "chunks", "outbox")
	if third.Stamps != first.Stamps {
		t.Errorf("load 3 rewrote rows: the timestamps of documents or outbox changed")
	}
	drCheckOutboxExact(t, ctx, "load 3", env.pool, wantOutbox)
	t.Logf("requests sent in all: %d", l.requests.Load())
}

// TestShuffledLoadConverges loads the corpus once in random order (older
// versions after newer ones) into a fresh database: documents and chunks
// must end exactly as after an in-order load, and the outbox must hold
// exactly one valid event per applied version. With 8 workers, versions of
// one key often race each other here, which the in-order loads never do.
func TestShuffledLoadConverges(t *testing.T) {
	t.Parallel()
	ctx, cancel := context.WithTimeout(t.Context(), 3*time.Minute)
	defer cancel()
	c := drGenCorpus(drCorpusKeys)
	rng := rand.New(rand.NewPCG(drCorpusSeed1+2, drCorpusSeed2))

	inOrder := newEnv(t)
	lo := drNewLoader(t, inOrder.srv.URL)
	drLoadInOrder(t, ctx, "in-order load", lo, c, drPlanInOrder(c, rng), func(*drOp) string { return "applied" })
	want := drSnapshot(t, ctx, inOrder.pool)

	shuffled := newEnv(t)
	ls := drNewLoader(t, shuffled.srv.URL)
	start := time.Now()
	recs, errs := ls.load(ctx, 8, drPlanShuffled(c, rng, 1))
	drFatalErrs(t, "shuffled load", errs)
	if len(recs) != len(c.ops) {
		t.Fatalf("shuffled load: %d answers, want one per op (%d)", len(recs), len(c.ops))
	}
	// Each version is sent once: it applies or finds a newer one; the
	// final version of each key always applies.
	counts := drCheckResults(t, "shuffled load", recs, func(o *drOp) string {
		if c.final[o.Key] == o {
			return "applied"
		}
		return ""
	})
	applied := map[drEvKey]bool{}
	lim := &drLimiter{t: t, label: "shuffled load"}
	for _, r := range recs {
		switch r.res.Result {
		case "applied":
			applied[drEvKey{r.op.Key, r.op.Version, string(r.op.kind())}] = true
		case "stale":
			if r.op.Version >= c.final[r.op.Key].Version {
				lim.errorf("%s answered stale, but no newer version exists", r.op)
			}
		default:
			lim.errorf("%s answered %q, want applied or stale", r.op, r.res.Result)
		}
	}
	lim.done()
	got := drSnapshot(t, ctx, shuffled.pool)
	t.Logf("shuffled load: %d ops in %d requests (%d via batch, %d via PUT/DELETE) in %v: %d applied, %d stale; %s (in order: %s)",
		len(recs), ls.requests.Load(), counts["batch"], counts["single"], time.Since(start).Round(time.Millisecond),
		counts["applied"], counts["stale"], drTableCounts(got), drTableCounts(want))

	drCompareStates(t, "shuffled vs in-order", want, got, "documents", "chunks")
	drCheckAgainstCorpus(t, ctx, "shuffled load", shuffled.pool, c)
	// The outbox holds one event per applied version, and nothing else.
	drCheckOutboxExact(t, ctx, "shuffled load", shuffled.pool, applied)
	drCheckOutboxEvents(t, ctx, "shuffled load", shuffled.pool, c)
}
