//go:build linux

package chaos

import (
	"fmt"
	"math/rand/v2"
	"net/url"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"sync"
	"time"

	"github.com/converge-sync/converge/internal/netfault"
)

// A link is the network between one service and one server it uses: a
// netfault proxy of its own, so that a fault can cut or freeze it while
// both ends keep running and every other service's link to that server
// stays up.
type link struct {
	service, server string
	proxy           *netfault.Proxy
}

func (l *link) String() string { return l.service + "↔" + l.server }

// links are every link the pipeline's services use, in the order made.
type links struct {
	mu      sync.Mutex
	servers map[string]string // server name -> its host:port
	all     []*link
}

// server names a server the services reach at addr (host:port): every
// service given that address in an argument or its environment reaches it
// through a link of its own instead.
func (ls *links) server(name, addr string) {
	ls.mu.Lock()
	defer ls.mu.Unlock()
	if ls.servers == nil {
		ls.servers = map[string]string{}
	}
	ls.servers[name] = addr
}

// route rewrites the address of every known server in args and env to the
// address of service's own link to it, making the link on first use.
func (ls *links) route(service string, args, env []string) error {
	for _, name := range slices.Sorted(func(yield func(string) bool) {
		for n := range ls.servers {
			if !yield(n) {
				return
			}
		}
	}) {
		addr := ls.servers[name]
		var via *link
		for _, list := range [][]string{args, env} {
			for i, s := range list {
				if !containsAddr(s, addr) {
					continue
				}
				if via == nil {
					l, err := ls.add(service, name, addr)
					if err != nil {
						return err
					}
					via = l
				}
				list[i] = replaceAddr(s, addr, via.proxy.Addr())
			}
		}
	}
	return nil
}

// add makes a link from service to the server at addr.
func (ls *links) add(service, server, addr string) (*link, error) {
	p, err := netfault.Start(netfault.Config{Target: addr})
	if err != nil {
		return nil, fmt.Errorf("link %s↔%s: %w", service, server, err)
	}
	l := &link{service: service, server: server, proxy: p}
	ls.mu.Lock()
	ls.all = append(ls.all, l)
	ls.mu.Unlock()
	return l, nil
}

// close heals every link and stops its proxy.
func (ls *links) close() {
	ls.mu.Lock()
	defer ls.mu.Unlock()
	for _, l := range ls.all {
		l.proxy.Resume()
		l.proxy.Heal()
		_ = l.proxy.Close()
	}
}

func (ls *links) list() []*link {
	ls.mu.Lock()
	defer ls.mu.Unlock()
	return slices.Clone(ls.all)
}

// containsAddr reports whether s holds addr not followed by another digit
// (127.0.0.1:80 is not in 127.0.0.1:8080).
func containsAddr(s, addr string) bool {
	for i := 0; ; {
		j := strings.Index(s[i:], addr)
		if j < 0 {
			return false
		}
		end := i + j + len(addr)
		if end == len(s) || s[end] < '0' || s[end] > '9' {
			return true
		}
		i = end
	}
}

func replaceAddr(s, addr, with string) string {
	var b strings.Builder
	for {
		j := strings.Index(s, addr)
		if j < 0 {
			b.WriteString(s)
			return b.String()
		}
		end := j + len(addr)
		b.WriteString(s[:j])
		if end == len(s) || s[end] < '0' || s[end] > '9' {
			b.WriteString(with)
		} else {
			b.WriteString(addr)
		}
		s = s[end:]
	}
}

// hostPort is the host:port of a URL ("nats://127.0.0.1:4222",
// "bolt://...") or of an address already in that form.
func hostPort(s string) string {
	if u, err := url.Parse(s); err == nil && u.Host != "" {
		return u.Host
	}
	return s
}

// linkFault is one link fault: the links it cut or froze and for how long.
type linkFault struct {
	links  []*link
	freeze bool
	heal   time.Duration
}

// pickLinks chooses a link fault from the numbers a fault draws: one link
// most of the time, two or three at once otherwise; a cut (every
// connection closed, new ones black-holed) or a freeze (connections kept,
// nothing forwarded: packets dropped, as a switch that fails does), healed
// after 1-8 s.
func pickLinks(all []*link, r *rand.Rand, n int, freeze bool, heal time.Duration) linkFault {
	n = min(n, len(all))
	idx := r.Perm(len(all))[:n]
	slices.Sort(idx)
	lf := linkFault{freeze: freeze, heal: heal}
	for _, i := range idx {
		lf.links = append(lf.links, all[i])
	}
	return lf
}

func (lf linkFault) apply() {
	for _, l := range lf.links {
		if lf.freeze {
			l.proxy.Pause()
		} else {
			l.proxy.Cut()
		}
	}
}

func (lf linkFault) undo() {
	for _, l := range lf.links {
		if lf.freeze {
			l.proxy.Resume()
		} else {
			l.proxy.Heal()
		}
	}
}

func (lf linkFault) String() string {
	names := make([]string, len(lf.links))
	for i, l := range lf.links {
		names[i] = l.String()
	}
	verb := "cut"
	if lf.freeze {
		verb = "frozen"
	}
	return fmt.Sprintf("%s %s for %v", strings.Join(names, ", "), verb, lf.heal.Round(time.Millisecond))
}

// clocks are the services' wall clocks: each service reads its offset
// from a file of its own (CONVERGE_FAULT_CLOCK_FILE), which a clock fault
// moves forward or back, as an NTP step or a VM restored from a snapshot
// does. The offset stays until the next jump of that service's clock.
type clocks struct {
	dir     string
	mu      sync.Mutex
	offsets map[string]time.Duration
}

const envFaultClockFile = "CONVERGE_FAULT_CLOCK_FILE"

func (c *clocks) file(service string) string { return filepath.Join(c.dir, service+".clock") }

// jump moves service's clock by d and returns its offset from the real
// time now.
func (c *clocks) jump(service string, d time.Duration) (time.Duration, error) {
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.offsets == nil {
		c.offsets = map[string]time.Duration{}
	}
	off := c.offsets[service] + d
	tmp := c.file(service) + ".tmp"
	if err := os.WriteFile(tmp, []byte(fmt.Sprintf("%+v\n", off)), 0o644); err != nil {
		return 0, err
	}
	if err := os.Rename(tmp, c.file(service)); err != nil {
		return 0, err
	}
	c.offsets[service] = off
	return off, nil
}

// jumpSize is a clock jump of 10 s to 20 min, forward or back, from two
// numbers a fault draws.
func jumpSize(size, sign float64) time.Duration {
	d := 10*time.Second + time.Duration(size*float64(20*time.Minute-10*time.Second))
	if sign < 0.5 {
		d = -d
	}
	return d.Round(time.Second)
}
