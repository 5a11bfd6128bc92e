package auth

import (
	"fmt"
	"net/netip"
	"net/url"
	"strings"
)

// InsecurePlainHTTPFlag is the flag that lets bearer tokens travel over
// plain HTTP beyond loopback: a service accept them, a client send them.
const InsecurePlainHTTPFlag = "insecure-plain-http"

// EnvInsecurePlainHTTP is the variable of -insecure-plain-http.
const EnvInsecurePlainHTTP = "CONVERGE_INSECURE_PLAIN_HTTP"

// CheckPlainHTTP decides whether a service may accept bearer tokens on
// addr: a token sent in clear can be read by anyone on the path, so with
// tokens and without TLS it refuses an address beyond loopback, unless
// insecurePlainHTTP (-insecure-plain-http) says the network between the
// clients and the service is trusted (a private container network, a
// proxy on the same host that ends TLS).
func CheckPlainHTTP(addr string, tokens *Tokens, tls, insecurePlainHTTP bool) error {
	if !tokens.Enabled() || tls || insecurePlainHTTP || Loopback(addr) {
		return nil
	}
	return fmt.Errorf("auth: refusing to accept bearer tokens over plain HTTP on %s: it is not a loopback address, so %w; "+
		"give the listener a certificate (-tls-cert and -tls-key), listen on 127.0.0.1, or pass -%s (%s) if the network is trusted",
		addr, ErrPlainHTTP, InsecurePlainHTTPFlag, EnvInsecurePlainHTTP)
}

// CheckSend decides whether a client may send token to the API at u: not
// over plain HTTP to a host beyond loopback, where anyone on the path
// could read it, unless insecurePlainHTTP (-insecure-plain-http). Without
// a token nothing secret is sent, and anything goes.
func CheckSend(u *url.URL, token string, insecurePlainHTTP bool) error {
	if token == "" || insecurePlainHTTP || u.Scheme != "http" || loopbackHost(u.Hostname()) {
		return nil
	}
	return fmt.Errorf("auth: refusing to send the bearer token over plain HTTP to %s: it is not a loopback address, so %w; "+
		"use https://%s (with -tls-ca, %s, naming the CA of its certificate), or pass -%s (%s) if the network is trusted",
		u.Host, ErrPlainHTTP, u.Host, EnvTLSCA, InsecurePlainHTTPFlag, EnvInsecurePlainHTTP)
}

// loopbackHost reports whether host (no port) is localhost or a loopback
// IP address.
func loopbackHost(host string) bool {
	if strings.EqualFold(host, "localhost") {
		return true
	}
	ip, err := netip.ParseAddr(host)
	return err == nil && ip.IsLoopback()
}
