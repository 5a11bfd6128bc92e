// Package localaddr picks loopback addresses for servers that listen
// later: the services of converge dev, and the tests' servers that must
// keep their port across a restart.
package localaddr

import (
	"math/rand/v2"
	"net"
	"os"
	"strconv"
	"strings"
)

// Free returns a free 127.0.0.1 address for a server to listen on later.
// Its port is drawn at random below the kernel's ephemeral range (the
// ports it hands to listeners on port 0 and to outgoing connections), so
// that between now and the server's bind no other socket of the machine is
// given it: the one collision left, another caller drawing the same port
// meanwhile, is unlikely.
func Free() (string, error) {
	lo := ephemeralLow()
	for range 100 {
		addr := "127.0.0.1:" + strconv.Itoa(1024+rand.IntN(lo-1024)) //nolint:gosec // a port to try, not a secret
		ln, err := net.Listen("tcp", addr)
		if err != nil {
			continue // taken
		}
		_ = ln.Close()
		return addr, nil
	}
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return "", err
	}
	defer ln.Close()
	return ln.Addr().String(), nil
}

// FreePort is the port of [Free].
func FreePort() (int, error) {
	addr, err := Free()
	if err != nil {
		return 0, err
	}
	_, port, _ := net.SplitHostPort(addr)
	return strconv.Atoi(port)
}

// ephemeralLow is the lowest port of the kernel's ephemeral range (Linux's
// net.ipv4.ip_local_port_range), or 32768 where it cannot be read or
// leaves too few ports below it.
func ephemeralLow() int {
	b, err := os.ReadFile("/proc/sys/net/ipv4/ip_local_port_range")
	if err != nil {
		return 32768
	}
	f := strings.Fields(string(b))
	if len(f) == 0 {
		return 32768
	}
	lo, err := strconv.Atoi(f[0])
	if err != nil || lo < 4096 {
		return 32768
	}
	return lo
}
