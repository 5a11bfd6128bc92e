package auth

import (
	"fmt"
	"net"
)

// InsecureNoAuthFlag is the flag that lets a service listen beyond loopback
// without tokens.
const InsecureNoAuthFlag = "insecure-no-auth"

// CheckListen decides whether a service may serve its API on addr: with
// tokens, anywhere; without, only on a loopback address, unless
// insecureNoAuth (-insecure-no-auth) says that unauthenticated requests
// from the network are wanted.
func CheckListen(addr string, tokens *Tokens, insecureNoAuth bool) error {
	if tokens.Enabled() || insecureNoAuth || Loopback(addr) {
		return nil
	}
	return fmt.Errorf("auth: refusing to serve %s without authentication: it is not a loopback address; "+
		"give a tokens file (-tokens-file or %s), listen on 127.0.0.1, or pass -%s to accept unauthenticated requests from the network",
		addr, EnvTokensFile, InsecureNoAuthFlag)
}

// Loopback reports whether addr (host:port) listens on loopback only:
// localhost, 127.0.0.0/8 or ::1. An empty host is every interface.
func Loopback(addr string) bool {
	host, _, err := net.SplitHostPort(addr)
	return err == nil && loopbackHost(host)
}
