//go:build linux

package partition_test

import (
	"bytes"
	"encoding/binary"
	"strings"
	"sync"
	"time"

	"golang.org/x/net/http2/hpack"

	"github.com/converge-sync/converge/internal/netfault"
)

// landing is a request that reached the store from one instance: when,
// and what it was.
type landing struct {
	At    time.Time
	What  string
	Write bool // it changes the store
}

// storeWire decodes what an instance sends its store through a
// netfault proxy (as the proxy's Tap), to tell when each of its writes
// reached the store, and whether a store call that writes is in flight.
type storeWire interface {
	tap(netfault.Segment)
	// requests is every request the store received, in order.
	requests() []landing
	// midCall reports whether a store call is in flight that has more to
	// write: a transaction begun and not committed, a read whose answer
	// the call's writes wait for.
	midCall() bool
}

// Bolt (Neo4j's protocol, 5.x): the client's handshake (the magic and
// four version proposals; after a manifest answer from the server, the
// chosen version and a capabilities varint), then messages in chunks (a
// two-byte size, the data; size 0 ends a message). A message is a
// PackStream struct: a marker byte and its signature.
const (
	boltRun      = 0x10
	boltBegin    = 0x11
	boltCommit   = 0x12
	boltRollback = 0x13
	boltReset    = 0x0F
	boltGoodbye  = 0x02
)

// boltManifest is the server's answer to a manifest handshake.
var boltManifest = []byte{0x00, 0x00, 0x01, 0xFF}

// boltReadMode is the entry mode: "r" of a BEGIN (or an auto-commit RUN)
// of a read transaction.
var boltReadMode = []byte{0x84, 'm', 'o', 'd', 'e', 0x81, 'r'}

// boltWire decodes the Bolt connections of one instance: a write lands
// with the COMMIT of a write transaction (or an auto-commit RUN that is
// not a read).
type boltWire struct {
	mu     sync.Mutex
	conns  map[uint64]*boltConn
	landed []landing
}

type boltConn struct {
	stage  int    // 0: the handshake's proposals; 1: the version chosen; 2: chunks
	out    []byte // bytes to the server not decoded yet
	server []byte // the server's first four bytes
	msg    []byte // the message being assembled
	tx     *boltTx
}

// boltTx is an open explicit transaction.
type boltTx struct {
	write bool
	first string // its first statement, shortened
}

func newBoltWire() *boltWire { return &boltWire{conns: map[uint64]*boltConn{}} }

func (w *boltWire) tap(s netfault.Segment) {
	w.mu.Lock()
	defer w.mu.Unlock()
	c := w.conns[s.Conn]
	if c == nil {
		c = &boltConn{}
		w.conns[s.Conn] = c
	}
	if s.Dir == netfault.ToClient {
		if n := 4 - len(c.server); n > 0 {
			c.server = append(c.server, s.Data[:min(n, len(s.Data))]...)
		}
	} else {
		c.out = append(c.out, s.Data...)
	}
	w.decode(c, s.At)
}

// decode consumes what it can of c.out.
func (w *boltWire) decode(c *boltConn, at time.Time) {
	for {
		switch c.stage {
		case 0:
			if len(c.out) < 20 {
				return
			}
			c.out, c.stage = c.out[20:], 1
		case 1:
			if len(c.server) < 4 {
				return // the server has not answered the proposals yet
			}
			if bytes.Equal(c.server, boltManifest) {
				i := 4
				for i < len(c.out) && c.out[i]&0x80 != 0 {
					i++
				}
				if i >= len(c.out) {
					return
				}
				c.out = c.out[i+1:]
			}
			c.stage = 2
		default:
			if len(c.out) < 2 {
				return
			}
			n := int(binary.BigEndian.Uint16(c.out))
			if len(c.out) < 2+n {
				return
			}
			if n == 0 {
				w.message(c, at)
				c.msg = c.msg[:0]
			} else {
				c.msg = append(c.msg, c.out[2:2+n]...)
			}
			c.out = c.out[2+n:]
		}
	}
}

func (w *boltWire) message(c *boltConn, at time.Time) {
	if len(c.msg) < 2 {
		return
	}
	switch c.msg[1] {
	case boltBegin:
		c.tx = &boltTx{write: !bytes.Contains(c.msg, boltReadMode)}
	case boltRun:
		st := boltStatement(c.msg)
		switch {
		case c.tx != nil && c.tx.first == "":
			c.tx.first = st
		case c.tx == nil:
			write := !bytes.Contains(c.msg, boltReadMode)
			w.landed = append(w.landed, landing{At: at, What: "auto-commit RUN " + st, Write: write})
		}
	case boltCommit:
		if c.tx != nil {
			w.landed = append(w.landed, landing{At: at, What: "COMMIT of " + c.tx.mode() + " transaction (" + c.tx.first + ")", Write: c.tx.write})
		}
		c.tx = nil
	case boltRollback, boltReset, boltGoodbye:
		c.tx = nil
	}
}

func (t *boltTx) mode() string {
	if t.write {
		return "a write"
	}
	return "a read"
}

// boltStatement is the head of a RUN message's statement: its first
// field, a PackStream string.
func boltStatement(msg []byte) string {
	if len(msg) < 3 {
		return ""
	}
	b := msg[2:]
	var n, head int
	switch m := b[0]; {
	case m >= 0x80 && m <= 0x8F:
		n, head = int(m&0x0F), 1
	case m == 0xD0 && len(b) >= 2:
		n, head = int(b[1]), 2
	case m == 0xD1 && len(b) >= 3:
		n, head = int(binary.BigEndian.Uint16(b[1:])), 3
	case m == 0xD2 && len(b) >= 5:
		n, head = int(binary.BigEndian.Uint32(b[1:])), 5
	default:
		return "?"
	}
	s := string(b[head:min(len(b), head+n)])
	s = strings.Join(strings.Fields(s), " ")
	if len(s) > 48 {
		s = s[:48] + "..."
	}
	return s
}

func (w *boltWire) requests() []landing {
	w.mu.Lock()
	defer w.mu.Unlock()
	return append([]landing(nil), w.landed...)
}

func (w *boltWire) midCall() bool {
	w.mu.Lock()
	defer w.mu.Unlock()
	for _, c := range w.conns {
		if c.tx != nil && c.tx.write {
			return true
		}
	}
	return false
}

// HTTP/2 (gRPC, Qdrant's API): the client's preface, then frames of a
// nine-byte header (length, type, flags, stream). A request's method is
// its :path header, HPACK-coded; it reaches the server whole with the
// frame that ends its stream.
const (
	h2Data         = 0x0
	h2Headers      = 0x1
	h2RSTStream    = 0x3
	h2Continuation = 0x9

	h2EndStream  = 0x1
	h2EndHeaders = 0x4
	h2Padded     = 0x8
	h2Priority   = 0x20
)

const h2Preface = "PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n"

// qdrantWrites are the gRPC methods of Qdrant that change a collection.
var qdrantWrites = map[string]bool{
	"/qdrant.Points/Upsert": true, "/qdrant.Points/Delete": true, "/qdrant.Points/UpdateVectors": true,
	"/qdrant.Points/DeleteVectors": true, "/qdrant.Points/SetPayload": true, "/qdrant.Points/OverwritePayload": true,
	"/qdrant.Points/DeletePayload": true, "/qdrant.Points/ClearPayload": true, "/qdrant.Points/UpdateBatch": true,
	"/qdrant.Points/CreateFieldIndex": true, "/qdrant.Points/DeleteFieldIndex": true,
	"/qdrant.Collections/Create": true, "/qdrant.Collections/Update": true, "/qdrant.Collections/Delete": true,
	"/qdrant.Collections/UpdateAliases": true,
}

// qdrantReadsBeforeWrites are the reads after whose answer a call of the
// index's adapter goes on writing: the markers' read (then the points'
// upsert and stale delete) and the count's scroll (then the markers'
// upsert).
var qdrantReadsBeforeWrites = map[string]bool{"/qdrant.Points/Get": true, "/qdrant.Points/Scroll": true}

// grpcWire decodes the HTTP/2 connections of one instance: a write lands
// when a request to one of qdrantWrites reaches the server whole.
type grpcWire struct {
	mu     sync.Mutex
	conns  map[uint64]*h2Conn
	landed []landing
}

type h2Conn struct {
	out, in     []byte // bytes each way not decoded yet
	preface     bool
	dec         *hpack.Decoder
	block       []byte // a header block being assembled
	blockStream uint32
	blockEnd    bool              // the HEADERS frame ended its stream
	paths       map[uint32]string // stream -> :path
	open        map[uint32]string // requests sent whole and not answered whole
}

func newGRPCWire() *grpcWire { return &grpcWire{conns: map[uint64]*h2Conn{}} }

func (w *grpcWire) tap(s netfault.Segment) {
	w.mu.Lock()
	defer w.mu.Unlock()
	c := w.conns[s.Conn]
	if c == nil {
		c = &h2Conn{dec: hpack.NewDecoder(4096, nil), paths: map[uint32]string{}, open: map[uint32]string{}}
		c.dec.SetAllowedMaxDynamicTableSize(1 << 20)
		w.conns[s.Conn] = c
	}
	if s.Dir == netfault.ToClient {
		c.in = append(c.in, s.Data...)
		c.in = h2Frames(c.in, func(typ, flags byte, stream uint32, _ []byte) {
			if typ == h2RSTStream || (typ == h2Headers || typ == h2Data) && flags&h2EndStream != 0 {
				delete(c.open, stream)
				delete(c.paths, stream)
			}
		})
		return
	}
	c.out = append(c.out, s.Data...)
	if !c.preface {
		if len(c.out) < len(h2Preface) {
			return
		}
		c.out, c.preface = c.out[len(h2Preface):], true
	}
	c.out = h2Frames(c.out, func(typ, flags byte, stream uint32, payload []byte) {
		switch typ {
		case h2Headers:
			if flags&h2Padded != 0 && len(payload) > 0 {
				pad := int(payload[0])
				payload = payload[1:max(1, len(payload)-pad)]
			}
			if flags&h2Priority != 0 && len(payload) >= 5 {
				payload = payload[5:]
			}
			c.block, c.blockStream, c.blockEnd = append(c.block[:0], payload...), stream, flags&h2EndStream != 0
			if flags&h2EndHeaders != 0 {
				w.headers(c, s.At)
			}
		case h2Continuation:
			c.block = append(c.block, payload...)
			if flags&h2EndHeaders != 0 {
				w.headers(c, s.At)
			}
		case h2Data:
			if flags&h2EndStream != 0 {
				w.sent(c, stream, s.At)
			}
		case h2RSTStream:
			delete(c.open, stream)
		}
	})
}

// h2Frames calls frame with each whole frame of b and returns what is
// left of b.
func h2Frames(b []byte, frame func(typ, flags byte, stream uint32, payload []byte)) []byte {
	for len(b) >= 9 {
		n := int(b[0])<<16 | int(b[1])<<8 | int(b[2])
		if len(b) < 9+n {
			break
		}
		frame(b[3], b[4], binary.BigEndian.Uint32(b[5:9])&0x7fffffff, b[9:9+n])
		b = b[9+n:]
	}
	if len(b) == 0 {
		return nil
	}
	return b
}

func (w *grpcWire) headers(c *h2Conn, at time.Time) {
	fields, err := c.dec.DecodeFull(c.block)
	path := "?"
	if err == nil {
		for _, f := range fields {
			if f.Name == ":path" {
				path = f.Value
			}
		}
	}
	c.paths[c.blockStream] = path
	if c.blockEnd {
		w.sent(c, c.blockStream, at)
	}
}

// sent records a request that reached the server whole.
func (w *grpcWire) sent(c *h2Conn, stream uint32, at time.Time) {
	path := c.paths[stream]
	c.open[stream] = path
	w.landed = append(w.landed, landing{At: at, What: path, Write: qdrantWrites[path]})
}

func (w *grpcWire) requests() []landing {
	w.mu.Lock()
	defer w.mu.Unlock()
	return append([]landing(nil), w.landed...)
}

func (w *grpcWire) midCall() bool {
	w.mu.Lock()
	defer w.mu.Unlock()
	for _, c := range w.conns {
		for _, path := range c.open {
			if qdrantReadsBeforeWrites[path] {
				return true
			}
		}
	}
	return false
}
