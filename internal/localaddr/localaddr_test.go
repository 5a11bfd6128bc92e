package localaddr

import (
	"net"
	"strconv"
	"testing"
)

// A picked address is on loopback, below the ephemeral range, and free.
func TestFreeIsBelowTheEphemeralRange(t *testing.T) {
	lo := ephemeralLow()
	seen := map[string]bool{}
	for range 20 {
		addr, err := Free()
		if err != nil {
			t.Fatal(err)
		}
		host, p, err := net.SplitHostPort(addr)
		if err != nil {
			t.Fatal(err)
		}
		port, _ := strconv.Atoi(p)
		if host != "127.0.0.1" || port < 1024 || port >= lo {
			t.Fatalf("%s: want 127.0.0.1 and a port in [1024, %d)", addr, lo)
		}
		ln, err := net.Listen("tcp", addr)
		if err != nil {
			t.Fatalf("%s is not free: %v", addr, err)
		}
		_ = ln.Close()
		seen[addr] = true
	}
	if len(seen) < 15 {
		t.Fatalf("20 picks gave %d addresses: not drawn at random", len(seen))
	}
}
