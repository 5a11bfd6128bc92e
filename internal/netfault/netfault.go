// Package netfault is a TCP proxy for tests that puts the faults of a
// network between a client and a server that both keep running: a
// partition ([Proxy.Cut], [Proxy.Heal]), a frozen link ([Proxy.Pause],
// [Proxy.Resume]) and latency ([Proxy.Latency]). The client is given
// [Proxy.Addr] instead of the server's address; the proxy listens on
// 127.0.0.1 unless told otherwise.
//
// A partition closes every connection through the proxy, both ways, and
// deals with each new one by [Config.CutMode]: by default it is accepted
// (the listening socket stays open) but never dialled through and sent
// nothing, so the client's handshake times out as it does when its
// packets are dropped ([BlackHole]); with [Reset] it is reset at once, as
// by a host that answers but refuses. Heal closes the connections a cut
// held and lets new ones through again.
//
// A frozen link keeps its connections open but forwards nothing: what
// either side sends waits in the proxy (and, once the proxy's queue is
// full, in the kernel's buffers) until Resume. [Proxy.PauseOneWay]
// freezes one direction alone: a server whose answers stop while the
// requests still reach it, so that a call stays in flight. Latency delays
// each byte by the same time in each direction, so a round trip takes
// twice it longer; order is kept.
//
// Each direction of a connection is forwarded on its own, in the order
// read. A [Config.Tap] sees every segment as it is written on: what
// crossed the link, and when, for a test to decode.
package netfault

import (
	"context"
	"errors"
	"fmt"
	"io"
	"net"
	"sync"
	"time"
)

// CutMode is what a cut does to the connections made while it lasts.
type CutMode int

const (
	// BlackHole accepts them and holds them open without dialling the
	// target or forwarding a byte, until Heal closes them: a partition
	// where the packets are lost.
	BlackHole CutMode = iota
	// Reset accepts them and resets them at once (RST): a partition where
	// something answers for the other end.
	Reset
)

func (m CutMode) String() string {
	switch m {
	case BlackHole:
		return "black hole"
	case Reset:
		return "reset"
	default:
		return fmt.Sprintf("CutMode(%d)", int(m))
	}
}

// Direction is the way a segment crosses the proxy.
type Direction int

const (
	// ToTarget is from the client to the target.
	ToTarget Direction = iota + 1
	// ToClient is from the target to the client.
	ToClient
)

func (d Direction) String() string {
	switch d {
	case ToTarget:
		return "to target"
	case ToClient:
		return "to client"
	default:
		return fmt.Sprintf("Direction(%d)", int(d))
	}
}

// Segment is bytes the proxy forwards in one write.
type Segment struct {
	// Conn numbers the connection (from 1, in the order they were
	// dialled through): a tap keeps a decoder per connection.
	Conn uint64
	Dir  Direction
	// At is when the segment is written on: when the other end gets it.
	At time.Time
	// Data is valid only during the Tap's call.
	Data []byte
}

// Config of a [Proxy].
type Config struct {
	// Target is the address (host:port) the proxy forwards to. Required.
	Target string
	// Listen is the address the proxy listens on; default 127.0.0.1:0.
	Listen string
	// CutMode is what a cut does to new connections; default BlackHole.
	CutMode CutMode
	// DialTimeout bounds the dial of the target for each connection
	// (a failed dial resets the client's connection); default 5s.
	DialTimeout time.Duration
	// Tap, when set, is called with every segment right before it is
	// written on (a write that then fails, its link cut meanwhile, was
	// tapped all the same), in order for each connection and direction;
	// calls for different connections or directions may be concurrent.
	// It must not keep Data, and should return soon: the link waits for
	// it.
	Tap func(Segment)
}

func (c *Config) setDefaults() {
	if c.Listen == "" {
		c.Listen = "127.0.0.1:0"
	}
	if c.DialTimeout <= 0 {
		c.DialTimeout = 5 * time.Second
	}
}

// Validate reports a configuration that cannot work.
func (c Config) Validate() error {
	if c.Target == "" {
		return errors.New("netfault: a target address is required")
	}
	if _, _, err := net.SplitHostPort(c.Target); err != nil {
		return fmt.Errorf("netfault: target %q: %w", c.Target, err)
	}
	if c.CutMode != BlackHole && c.CutMode != Reset {
		return fmt.Errorf("netfault: unknown cut mode %d", int(c.CutMode))
	}
	return nil
}

// Stats counts what a proxy did.
type Stats struct {
	Accepted int // connections accepted
	Linked   int // of them, dialled through to the target
	Live     int // linked and open now
	Held     int // held open by the cut now (BlackHole)
	Reset    int // reset by a cut (Reset)
	// Bytes forwarded to the target and to the clients.
	ToTarget, ToClient int64
}

// Proxy forwards the connections made to its address to its target. It
// is safe for concurrent use.
type Proxy struct {
	cfg    Config
	ln     net.Listener
	dialer context.Context // canceled by Close: dials in progress end
	stop   context.CancelFunc
	wg     sync.WaitGroup // the accept loop and every connection's goroutines

	mu      sync.Mutex
	closed  bool
	cut     bool
	paused  map[Direction]chan struct{} // a paused direction's; closed when the pause ends
	latency time.Duration
	nextID  uint64
	links   map[*link]struct{}
	held    map[net.Conn]struct{}
	stats   Stats
}

// Start listens on cfg.Listen and forwards every connection to
// cfg.Target until Close.
func Start(cfg Config) (*Proxy, error) {
	cfg.setDefaults()
	if err := cfg.Validate(); err != nil {
		return nil, err
	}
	ln, err := net.Listen("tcp", cfg.Listen)
	if err != nil {
		return nil, fmt.Errorf("netfault: listen: %w", err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	p := &Proxy{cfg: cfg, ln: ln, dialer: ctx, stop: cancel, links: map[*link]struct{}{}, held: map[net.Conn]struct{}{},
		paused: map[Direction]chan struct{}{}}
	p.wg.Add(1)
	go p.serve()
	return p, nil
}

// Addr is the address the clients connect to instead of the target's.
func (p *Proxy) Addr() string { return p.ln.Addr().String() }

// Target is the address the proxy forwards to.
func (p *Proxy) Target() string { return p.cfg.Target }

// Cut partitions the link: every connection is closed, both ways (reset,
// with the Reset mode), and new connections are held or reset until Heal.
func (p *Proxy) Cut() {
	p.mu.Lock()
	p.cut = true
	links := p.takeLinks()
	p.mu.Unlock()
	for _, l := range links {
		l.close(p.cfg.CutMode == Reset)
	}
}

// Heal ends a partition: the connections it held are closed (their
// clients connect again), and new connections are forwarded.
func (p *Proxy) Heal() {
	p.mu.Lock()
	p.cut = false
	held := p.held
	p.held = map[net.Conn]struct{}{}
	p.mu.Unlock()
	for c := range held {
		_ = c.Close()
	}
}

// Pause freezes the link: connections stay open, but no byte is
// forwarded either way until Resume. A segment already being written when
// Pause is called is written whole.
func (p *Proxy) Pause() {
	p.mu.Lock()
	defer p.mu.Unlock()
	p.pauseLocked(ToTarget)
	p.pauseLocked(ToClient)
}

// PauseOneWay freezes direction d alone until Resume: with ToClient, the
// requests reach the target but its answers wait in the proxy.
func (p *Proxy) PauseOneWay(d Direction) {
	p.mu.Lock()
	defer p.mu.Unlock()
	p.pauseLocked(d)
}

func (p *Proxy) pauseLocked(d Direction) {
	if p.paused[d] == nil {
		p.paused[d] = make(chan struct{})
	}
}

// Resume ends every pause: what waited is forwarded, in order.
func (p *Proxy) Resume() {
	p.mu.Lock()
	defer p.mu.Unlock()
	for d, resumed := range p.paused {
		close(resumed)
		delete(p.paused, d)
	}
}

// Latency delays every byte read from now on by d before it is forwarded,
// in each direction (0: none).
func (p *Proxy) Latency(d time.Duration) {
	p.mu.Lock()
	defer p.mu.Unlock()
	p.latency = max(d, 0)
}

// Stats counts what the proxy did so far.
func (p *Proxy) Stats() Stats {
	p.mu.Lock()
	defer p.mu.Unlock()
	s := p.stats
	s.Live, s.Held = len(p.links), len(p.held)
	return s
}

// Close stops listening, closes every connection and returns once every
// goroutine the proxy started has ended. It may be called again.
func (p *Proxy) Close() error {
	p.mu.Lock()
	if p.closed {
		p.mu.Unlock()
		return nil
	}
	p.closed = true
	links := p.takeLinks()
	held := p.held
	p.held = map[net.Conn]struct{}{}
	p.mu.Unlock()
	p.stop()
	err := p.ln.Close()
	for _, l := range links {
		l.close(false)
	}
	for c := range held {
		_ = c.Close()
	}
	p.wg.Wait()
	if errors.Is(err, net.ErrClosed) {
		err = nil
	}
	return err
}

// takeLinks empties the set of live links and returns them; p.mu held.
func (p *Proxy) takeLinks() []*link {
	links := make([]*link, 0, len(p.links))
	for l := range p.links {
		links = append(links, l)
	}
	clear(p.links)
	return links
}

// serve accepts connections until the listener is closed.
func (p *Proxy) serve() {
	defer p.wg.Done()
	for {
		c, err := p.ln.Accept()
		if err != nil {
			var ne net.Error
			if errors.As(err, &ne) && ne.Timeout() {
				continue
			}
			return // closed
		}
		p.mu.Lock()
		p.stats.Accepted++
		switch {
		case p.closed:
			_ = c.Close()
		case p.cut && p.cfg.CutMode == Reset:
			p.stats.Reset++
			reset(c)
		case p.cut:
			p.held[c] = struct{}{}
		default:
			p.wg.Add(1)
			go p.forward(c)
		}
		p.mu.Unlock()
	}
}

// reset closes c with an RST rather than a FIN.
func reset(c net.Conn) {
	if tc, ok := c.(*net.TCPConn); ok {
		_ = tc.SetLinger(0)
	}
	_ = c.Close()
}

// link is one client connection and its connection to the target.
type link struct {
	id             uint64
	client, target net.Conn
	done           chan struct{} // closed by close
	once           sync.Once
}

// close ends both connections (with RST when rst), and wakes the link's
// goroutines.
func (l *link) close(rst bool) {
	l.once.Do(func() {
		close(l.done)
		if rst {
			reset(l.client)
			reset(l.target)
			return
		}
		_ = l.client.Close()
		_ = l.target.Close()
	})
}

// forward dials the target for the client connection c and forwards both
// ways until both ends have finished, or the link is cut or closed.
func (p *Proxy) forward(c net.Conn) {
	defer p.wg.Done()
	d := net.Dialer{Timeout: p.cfg.DialTimeout}
	t, err := d.DialContext(p.dialer, "tcp", p.cfg.Target)
	if err != nil {
		reset(c) // as the target's refusal would
		return
	}
	p.mu.Lock()
	if p.closed || p.cut {
		// Closed or cut while the dial was under way: the cut closes
		// every connection it finds, this one too.
		p.mu.Unlock()
		_ = c.Close()
		_ = t.Close()
		return
	}
	p.nextID++
	l := &link{id: p.nextID, client: c, target: t, done: make(chan struct{})}
	p.links[l] = struct{}{}
	p.stats.Linked++
	p.mu.Unlock()

	var dirs sync.WaitGroup
	dirs.Go(func() { p.pipe(l, c, t, ToTarget) })
	dirs.Go(func() { p.pipe(l, t, c, ToClient) })
	dirs.Wait()
	l.close(false)
	p.mu.Lock()
	delete(p.links, l)
	p.mu.Unlock()
}

// segment is bytes read and waiting to be forwarded.
type segment struct {
	data []byte
	due  time.Time // read time plus the latency then
}

// queueLen is how many segments a direction holds before its reader
// stops reading (and the kernel's buffers fill).
const queueLen = 64

// pipe forwards src to dst: a reader queues what it reads, and this
// goroutine writes it on once its latency has passed and while the link is
// not paused. An end of src (EOF) is passed on as a half-close of dst; a
// failure of either side closes the link.
func (p *Proxy) pipe(l *link, src, dst net.Conn, dir Direction) {
	queue := make(chan segment, queueLen)
	var readErr error // set before queue is closed
	var reader sync.WaitGroup
	reader.Go(func() {
		defer close(queue)
		buf := make([]byte, 32<<10)
		for {
			n, err := src.Read(buf)
			if n > 0 {
				s := segment{data: append([]byte(nil), buf[:n]...), due: time.Now().Add(p.currentLatency())}
				select {
				case queue <- s:
				case <-l.done:
					return
				}
			}
			if err != nil {
				readErr = err
				return
			}
		}
	})
	defer reader.Wait()
	for {
		var s segment
		var ok bool
		select {
		case s, ok = <-queue:
		case <-l.done:
			return
		}
		if !ok {
			if errors.Is(readErr, io.EOF) {
				if cw, ok := dst.(interface{ CloseWrite() error }); ok {
					_ = cw.CloseWrite()
					return
				}
			}
			l.close(false)
			return
		}
		if !p.wait(l, dir, s.due) {
			return
		}
		if p.cfg.Tap != nil {
			p.cfg.Tap(Segment{Conn: l.id, Dir: dir, At: time.Now(), Data: s.data})
		}
		if _, err := dst.Write(s.data); err != nil {
			l.close(false)
			return
		}
		p.mu.Lock()
		if dir == ToTarget {
			p.stats.ToTarget += int64(len(s.data))
		} else {
			p.stats.ToClient += int64(len(s.data))
		}
		p.mu.Unlock()
	}
}

func (p *Proxy) currentLatency() time.Duration {
	p.mu.Lock()
	defer p.mu.Unlock()
	return p.latency
}

// wait returns once a segment going dir, due at due, may be written: its
// latency has passed and dir is not paused; false when the link closed
// first.
func (p *Proxy) wait(l *link, dir Direction, due time.Time) bool {
	if d := time.Until(due); d > 0 {
		timer := time.NewTimer(d)
		defer timer.Stop()
		select {
		case <-timer.C:
		case <-l.done:
			return false
		}
	}
	for {
		p.mu.Lock()
		resumed := p.paused[dir]
		p.mu.Unlock()
		if resumed == nil {
			return true
		}
		select {
		case <-resumed:
		case <-l.done:
			return false
		}
	}
}
