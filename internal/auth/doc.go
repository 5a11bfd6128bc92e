// Package auth guards converge's HTTP APIs with bearer tokens.
//
// A service that changes state over HTTP is given a tokens file
// (-tokens-file, env CONVERGE_TOKENS_FILE). Each line holds one token: its
// name, its scopes (comma-separated) and the token itself, separated by
// spaces or tabs:
//
//	# name          scopes       token
//	writer-client   write        sk_9f2c1e0d7a5b4c3e8f6a
//	ops             admin,read   sk_0b1c2d3e4f5a6b7c8d9e
//
// Blank lines and lines whose first non-blank character is # are ignored.
// A token is at least [MinTokenBytes] bytes of printable ASCII without
// spaces; the same token on two lines, an unknown scope, a missing token,
// a short one, or a file with no token at all is refused, and the error
// names the line, never the token. A name may repeat, so that a client's
// old and new tokens can both be accepted while it rotates them; the name
// (never the token) appears in logs.
//
// The scopes are independent: [Write] lets a client store and withdraw
// documents, [Admin] re-emit events and rebuild projections, [Read] search,
// read the graph and ask for verify digests. Admin implies neither of the
// others; give a token "admin,read" for both.
//
// [Guard.Require] wraps a route: a request without a bearer token, or with
// one not in the file, is answered 401 unauthorized with
// WWW-Authenticate: Bearer; a known token without the route's scope, 403
// forbidden. Tokens are compared as SHA-256 digests in constant time,
// against every known token whatever matches first. [Tokens.Reload]
// re-reads the file, and [Tokens.Watch] does so on SIGHUP; a file that no
// longer parses leaves the previous tokens in force.
//
// Without a tokens file, authentication is off. [CheckListen] lets a
// service do so only on a loopback address, unless it is given
// -insecure-no-auth.
//
// No token crosses the network in clear. With a tokens file and no TLS key
// pair, [CheckPlainHTTP] lets a service listen only on a loopback address,
// unless it is given -insecure-plain-http (the network is trusted);
// [Settings.CheckListen] applies both rules.
//
// On the client side, [TokenFromEnv] reads CONVERGE_TOKEN (or the file
// named by CONVERGE_TOKEN_FILE), and [Transport] or [SetBearer] sends it.
// A service's address is host:port (plain HTTP) or an http:// or https://
// URL ([BaseURL]); [Endpoint.URL] refuses, before any request, a token
// bound for plain HTTP beyond loopback ([CheckSend]) unless
// -insecure-plain-http. [ClientSettings] are the CLI's -tls-ca (the CAs of
// the services' certificates) and -insecure-plain-http.
package auth
